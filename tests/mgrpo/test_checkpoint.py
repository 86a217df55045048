import torch

from mgrpo.checkpoint import (
    is_sharded,
    latest_checkpoint,
    load_optimizer_state,
    restore_trainer_state,
    save_checkpoint,
    save_sharded_optimizer,
)
from mgrpo.models import build_model


def test_keeps_the_newest_and_every_nth(tmp_path, tokenizer):
    model = build_model("tiny", tokenizer)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(7):
        save_checkpoint(
            tmp_path,
            model,
            tokenizer,
            opt.state_dict(),
            step=step,
            version=step + 1,
            keep=2,
            keep_every_steps=3,
        )
    kept = sorted(p.name for p in tmp_path.glob("step-*"))
    assert kept == ["step-000002", "step-000005", "step-000006"]  # every 3rd step count, and the newest 2
    assert latest_checkpoint(tmp_path).step == 6 and latest_checkpoint(tmp_path, step=2).version == 3
    assert not list(tmp_path.glob(".*partial"))


def test_a_sharded_optimizer_state_is_written_inside_the_checkpoint(tmp_path, tokenizer):
    """`write_optimizer` writes the shards into the checkpoint before it is complete; restoring names
    their folder, and one process loads them (here the one process wrote them too)."""
    model = build_model("tiny", tokenizer)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    seen = []

    def write(folder):
        seen.append(folder)
        save_sharded_optimizer(model, opt, folder)

    info = save_checkpoint(tmp_path, model, tokenizer, None, step=0, version=1, write_optimizer=write)
    assert seen[0].parent.name.endswith(".partial")  # inside the checkpoint before its rename
    state = restore_trainer_state(info)
    assert is_sharded(state) and state["dcp"] == str(info.path / "optimizer")
    fresh = torch.optim.AdamW(model.parameters())
    load_optimizer_state(model, fresh, state)
    assert opt.state and all(
        torch.equal(fresh.state[p]["exp_avg_sq"], s["exp_avg_sq"]) for p, s in opt.state.items()
    )


def test_the_retention_rule_keeps_the_newest_and_every_nth():
    from mgrpo.retention import retained

    assert retained(range(10)) == {8, 9}
    assert retained(range(10), keep_every_steps=5) == {4, 8, 9}  # step counts 5 and 10 (9 is newest too)
    assert retained([3], keep=2) == {3} and retained([]) == set()
