import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import policy_loss


def loop_reference(logp, old, adv, mask, cl=0.2, ch=0.28, agg="seq-mean-token-mean", ref=None, beta=0.0):
    """A token-by-token reference of algorithm.md §5, independent of the vectorised code."""
    seq_losses, all_tok, n_tok = [], 0.0, 0
    for b in range(logp.shape[0]):
        tot, n = 0.0, 0
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = float(adv[b]) if adv.dim() == 1 else float(adv[b, t])
            lr = max(-20.0, min(20.0, float(logp[b, t] - old[b, t])))
            r = math.exp(lr)
            term = -min(r * a, max(1 - cl, min(1 + ch, r)) * a)
            if ref is not None and beta > 0:
                d = float(ref[b, t] - logp[b, t])
                term += beta * (math.exp(d) - d - 1)
            tot, n = tot + term, n + 1
        if n:
            seq_losses.append(tot / n)
        all_tok, n_tok = all_tok + tot, n_tok + n
    if agg == "token-mean":
        return all_tok / max(n_tok, 1)
    return sum(seq_losses) / max(len(seq_losses), 1)


def grad_of(logp0, old, adv, mask, **kw):
    logp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask, **kw)
    loss.backward()
    return logp.grad


def test_on_policy_hand_numbers():
    # ratio 1 everywhere → loss = −mean(A) per sequence: seqs have A=2 (2 tokens) and A=−1 (1 token)
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    loss, m = policy_loss(logp, logp, torch.tensor([2.0, -1.0]), mask)
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2)
    loss_tok, _ = policy_loss(logp, logp, torch.tensor([2.0, -1.0]), mask, agg="token-mean")
    assert loss_tok.item() == pytest.approx((-2 - 2 + 1) / 3)
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0)


def test_gradient_sign_follows_advantage():
    logp, mask = torch.zeros(2, 4), torch.ones(2, 4)
    g = grad_of(logp, logp, torch.tensor([1.0, -1.0]), mask)
    assert (g[0] < 0).all()  # descent raises logp of positively advantaged tokens
    assert (g[1] > 0).all()


def test_clipping_stops_gradient_in_the_right_direction():
    old = torch.zeros(1, 4)
    # ratios: 1.5 (above 1+0.28), 1.1 (inside), 0.5 (below 1−0.2), 0.9 (inside)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]]))
    mask = torch.ones(1, 4)
    g_pos = grad_of(logp, old, torch.tensor([1.0]), mask)[0]
    assert g_pos[0] == 0  # A>0, ratio too high: clipped, no push further up
    assert g_pos[1] != 0 and g_pos[3] != 0
    assert g_pos[2] != 0  # A>0, ratio too low: pessimistic min keeps the gradient
    g_neg = grad_of(logp, old, torch.tensor([-1.0]), mask)[0]
    assert g_neg[2] == 0  # A<0, ratio too low: clipped
    assert g_neg[0] != 0  # A<0, ratio too high: gradient kept
    _, m = policy_loss(logp, old, torch.tensor([1.0]), mask)
    assert m["clip_frac"] == pytest.approx(0.25)


def test_clip_high_is_asymmetric():
    old = torch.zeros(1, 1)
    just_inside = torch.log(torch.tensor([[1.25]]))  # < 1.28 → not clipped with clip-higher
    assert grad_of(just_inside, old, torch.tensor([1.0]), torch.ones(1, 1))[0, 0] != 0
    assert grad_of(just_inside, old, torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.2)[0, 0] == 0


def test_masked_tokens_get_zero_gradient():
    logp = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)) * 0.01  # ratios stay inside the clip
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]])
    g = grad_of(logp, torch.zeros(3, 5), torch.tensor([1.0, 2.0, -1.0]), mask)
    assert (g[mask == 0] == 0).all()
    assert (g[mask == 1] != 0).all()


def test_log_ratio_clamp_keeps_loss_finite():
    logp, old = torch.tensor([[0.0]]), torch.tensor([[-1000.0]])
    loss, m = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    assert torch.isfinite(loss) and m["ratio_max"] == pytest.approx(float(torch.tensor(20.0).exp()))


def test_kl_term_and_metrics():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), -0.5)
    loss0, m0 = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref)
    loss1, _ = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    k3 = torch.tensor(-0.5).exp().item() + 0.5 - 1
    assert loss0.item() == 0.0 and m0["kl_ref"] == pytest.approx(k3)
    assert loss1.item() == pytest.approx(0.1 * k3)
    _, m = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), entropy=torch.tensor([[1.0, 3.0]]))
    assert m["entropy"] == pytest.approx(2.0)


def test_bad_input_says_what_to_fix():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="logp_old"):
        policy_loss(x, torch.zeros(2, 4), torch.zeros(2), x)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(x, x, torch.zeros(2), x, kl_coef=0.1)
    with pytest.raises(ValueError, match="agg"):
        policy_loss(x, x, torch.zeros(2), x, agg="sum")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.sampled_from(["seq-mean-token-mean", "token-mean"]),
    st.booleans(),
    st.integers(0, 10_000),
)
def test_vectorised_matches_loop(b, t, agg, per_token_adv, seed):
    gen = torch.Generator().manual_seed(seed)
    logp = torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.5
    old = logp + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn((b, t) if per_token_adv else (b,), generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.3).to(torch.float64)
    loss, _ = policy_loss(logp, old, adv, mask, agg=agg, ref_logp=ref, kl_coef=0.05)
    assert loss.item() == pytest.approx(
        loop_reference(logp, old, adv, mask, agg=agg, ref=ref, beta=0.05), abs=1e-9
    )


def stale_loop_reference(logp, old, prox, adv, mask, cap=2.0, cl=0.2, ch=0.28):
    """algorithm.md §7 token by token (seq-mean-token-mean): ratio against logp_prox, each token's term times
    min(exp(prox − old), cap)."""
    seqs = []
    for b in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a, r = float(adv[b]), math.exp(float(logp[b, t] - prox[b, t]))
            w = min(math.exp(float(prox[b, t] - old[b, t])), cap)
            terms.append(-w * min(r * a, max(1 - cl, min(1 + ch, r)) * a))
        if terms:
            seqs.append(sum(terms) / len(terms))
    return sum(seqs) / max(len(seqs), 1)


def test_stale_samples_are_corrected_by_the_truncated_importance_weight():
    g = torch.Generator().manual_seed(3)
    logp, old, prox = (-torch.rand(3, 6, generator=g) * 2 for _ in range(3))
    old[0, 0] = prox[0, 0] - 2.0  # w = e² ≈ 7.4, capped at 2
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), (torch.rand(3, 6, generator=g) > 0.2).float()
    mask[0, 0] = 1.0
    loss, m = policy_loss(logp, old, adv, mask, logp_prox=prox)
    assert float(loss) == pytest.approx(stale_loop_reference(logp, old, prox, adv, mask), abs=1e-6)
    assert m["is_capped_frac"] > 0 and m["is_weight_mean"] > 0
    # one token by hand: A = 1, logp = prox (ρ = 1), prox − old = log 1.5 → w = 1.5, term −1.5
    one = torch.zeros(1, 1)
    loss, _ = policy_loss(one, one - math.log(1.5), torch.tensor([1.0]), torch.ones(1, 1), logp_prox=one)
    assert float(loss) == pytest.approx(-1.5)


def test_the_correction_reduces_to_the_on_policy_loss_when_versions_match():
    g = torch.Generator().manual_seed(4)
    logp, old = -torch.rand(4, 5, generator=g), -torch.rand(4, 5, generator=g)
    adv, mask = torch.randn(4, generator=g), torch.ones(4, 5)
    on, _ = policy_loss(logp, old, adv, mask)
    stale, m = policy_loss(logp, old, adv, mask, logp_prox=old)
    assert float(stale) == pytest.approx(float(on), abs=1e-7) and m["is_weight_mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="is_cap"):
        policy_loss(logp, old, adv, mask, logp_prox=old, is_cap=0.0)
