"""Reproducible warm starts: the CPU numerics every process pins, and what a warm-start cache key covers.

**Numerics.** On CPU, torch picks its vectorised kernels by the processor's instruction set (ATen's
CPU capability: AVX2, AVX-512, …) and MKL picks its GEMM code path by processor (and vendor). Measured
here (AMD EPYC, AVX2): with ATen's `default` kernels even a freshly initialised model differs bit for
bit from the AVX2 one, and MKL's `COMPATIBLE` path changes the weights after three SFT steps. So the
same seed gave different warm starts on two machines of one kind with different processors. Every
mgrpo process therefore pins both to AVX2 (which every x86-64 server of the last decade has), before
torch's first operation: `ATEN_CPU_CAPABILITY=avx2`, `MKL_CBWR=AVX2,STRICT`. Either variable already
set wins; `MGRPO_PIN_CPU_NUMERICS=0` turns the pinning off. Thread counts do not enter: MKL's plain
`AVX2` path is reproducible only for a fixed number of threads, and on an Intel Xeon with AVX-512 a
warm start on 1 and on 2 intra-op threads differed bit for bit (2026-12-02; on the AMD machine they had
not); the `STRICT` mode makes its results independent of the thread count, measured identical there.

Across vendors the pin does not hold: MKL honours `AVX2` on Intel processors only, and on others runs
its `AUTO` branch (`MKL_VERBOSE=1` prints `CNR:AUTO,STRICT` on the AMD EPYC machines), so an Intel
and an AMD machine build different warm starts (measured: the demo's warm start evaluates 0.203 on
one, 0.165 on the other). MKL's only vendor-neutral branch, `COMPATIBLE` (SSE2), made the SFT step
2.2x slower here (1.55 against 0.70 s, 2026-12-03), so it is not the default; `MKL_CBWR=COMPATIBLE,STRICT`
set before a run selects it (a different cache key, not verified on an Intel machine). Within a vendor
MKL's `AUTO` branch differs by generation too: the shipped warm start's 1,600 seeded held-out outcomes
from one AMD EPYC matched those of another (family 25 model 1, AVX2 only) on 1,531 (2026-12-06), so the
demo's shipped baseline is keyed by what the models compute on this processor and serves only the
processor model that evaluated it (`demo_baseline`).

**Cache keys.** A cached warm start is reused only when everything that changes its result is the
same: its config, the version of each generator it consumes (`RECIPE_VERSIONS`: bump one when its code
changes what it produces; `tests/mgrpo/test_reproducibility.py` holds a fingerprint of the generated
data per version and fails when the data changes without a bump), the model presets, and the versions
of torch, transformers and tokenizers and the pinned numerics.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from typing import Any

NUMERICS_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}

# One version per generator a warm start consumes: bump it when a change to its code changes its output.
RECIPE_VERSIONS = {
    "world": 1,  # mgrpo.tasks.world: people, cities, documents
    "questions": 1,  # mgrpo.tasks.deep_research: questions, plans, answers
    "demos": 2,  # mgrpo.tasks.demos and mgrpo.agents: demonstration transcripts (2: the demo-format bump of old)
    "arithmetic": 1,  # mgrpo.tasks.arithmetic: MarsRL problems, solutions, reports
    "tokenizer": 1,  # mgrpo.models.train_tokenizer
    "sft": 2,  # the SFT recipe (2: length-sorted micro-batches in the deep-research warm starts)
}
LIBRARIES = ("torch", "transformers", "tokenizers")


def pin_cpu_numerics() -> None:
    """Pin torch's and MKL's CPU code paths (see the module docstring). Called when `mgrpo` is imported,
    which is before any torch operation in every mgrpo process; it has no effect once torch has run one."""
    if os.environ.get("MGRPO_PIN_CPU_NUMERICS", "1") == "0":
        return
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    for name, value in NUMERICS_ENV.items():
        os.environ.setdefault(name, value)


def environment() -> dict[str, Any]:
    """The library versions and numerics that a warm start's weights depend on."""
    versions: dict[str, str | None] = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:  # pragma: no cover - all three are dependencies
            versions[lib] = None
    return {"libraries": versions, "numerics": {k: os.environ.get(k) for k in NUMERICS_ENV}}


def cache_key(config: dict[str, Any], *, presets: dict[str, Any]) -> str:
    """12 hex digits over the config, `RECIPE_VERSIONS`, the presets the config names and `environment()`."""
    blob = json.dumps(
        {"config": config, "recipe": RECIPE_VERSIONS, "presets": presets, "environment": environment()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def provenance(config: dict[str, Any], *, presets: dict[str, Any]) -> dict[str, Any]:
    """What a cached warm start's `config.json` records: everything its key covers, readable."""
    return {"config": config, "recipe": RECIPE_VERSIONS, "presets": presets, **environment()}
