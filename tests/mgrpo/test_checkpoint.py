import torch

from mgrpo.checkpoint import latest_checkpoint, save_checkpoint
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
