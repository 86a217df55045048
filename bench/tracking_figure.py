"""The curves a tracked run left in TensorBoard's event files, read back with TensorBoard's own reader
and drawn side by side per role (issue 40; what `tensorboard --logdir` shows, without a browser).

    .venv/bin/mgrpo demo --tracking tensorboard --run-dir runs/tracked
    .venv/bin/python bench/tracking_figure.py runs/tracked/tracking/tensorboard --out docs/tracking-curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PANELS = (  # (title, tag suffix): each role's curve of that metric, where it has one
    ("reward (mean per step)", "reward_mean"),
    ("advantage spread", "adv_std"),
    ("share of samples in all-equal groups", "flat_share"),
    ("update: gradient norm", "grad_norm"),
)


def read(logdir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run (`<job>/<role>`) → tag → [(step, value)]."""
    out = {}
    for run in sorted(p.parent for p in logdir.glob("*/*/events.out.tfevents.*")):
        acc = EventAccumulator(str(run))
        acc.Reload()
        out[f"{run.parent.name}/{run.name}"] = {
            tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", type=Path, help="<run dir>/tracking/tensorboard")
    ap.add_argument("--out", type=Path, default=Path("docs/tracking-curves.png"))
    args = ap.parse_args()
    runs = read(args.logdir)
    if not runs:
        raise SystemExit(f"no TensorBoard runs under {args.logdir}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (title, suffix) in zip(axes, PANELS, strict=True):
        for run, tags in runs.items():
            role = run.split("/")[-1]
            points = tags.get(f"{role}/{suffix}")
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", label=role)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"job {next(iter(runs)).split('/')[0]}: read back from its TensorBoard event files", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
