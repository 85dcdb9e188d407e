"""The GPU timings book/inference/measured.ipynb quotes are the ones the benchmark wrote.

The page cannot rerun ``scripts/bench_decode.py`` without CUDA, so it stores the times in
a folded cell; the benchmark's raw output is ``scripts/bench_decode_h200.json``.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "inference" / "measured.ipynb"
RAW = ROOT / "scripts" / "bench_decode_h200.json"


def _stored_table() -> dict[tuple[int, int, int], tuple[float, float | None]]:
    cells = json.loads(PAGE.read_text(encoding="utf-8"))["cells"]
    (cell,) = [cell for cell in cells if cell.get("id") == "gpu-measured"]
    namespace: dict[str, object] = {}
    exec("".join(cell["source"]), namespace)  # a literal dict, nothing else
    return namespace["measured"]  # type: ignore[return-value]


def test_the_page_stores_the_benchmarks_own_times_to_four_digits() -> None:
    raw = json.loads(RAW.read_text(encoding="utf-8"))
    assert raw["device"] == "NVIDIA H200" and raw["sizes"]["dtype"] == "bfloat16"
    expected = {
        (row["batch"], row["length"], row["num_kv_heads"]): (row["ms"], row.get("uncached_ms"))
        for row in raw["rows"]
    }
    stored = _stored_table()
    assert stored.keys() == expected.keys()
    for key, (ms, uncached) in expected.items():
        assert stored[key][0] == float(f"{ms:.4g}"), key
        assert stored[key][1] == (None if uncached is None else float(f"{uncached:.4g}")), key


def test_the_page_says_how_the_benchmark_timed() -> None:
    cells = json.loads(PAGE.read_text(encoding="utf-8"))["cells"]
    prose = " ".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
    told = re.search(
        r"mean of (\d+)\s+steps timed with CUDA events after (\d+) untimed ones "
        r"\(without the cache, (\d+) after (\d+)\)",
        " ".join(prose.split()),
    )
    assert told, "the page's 'How it was timed' no longer says the counts"
    script = (ROOT / "scripts" / "bench_decode.py").read_text(encoding="utf-8")
    raw = json.loads(RAW.read_text(encoding="utf-8"))
    repeat, warmup, uncached, uncached_warmup = (int(n) for n in told.groups())
    assert raw["repeat"] == repeat and f"warmup: int = {warmup})" in script
    assert f"uncached_step(h_kv, batch, length, {uncached})" in script
    assert f"repeat, warmup={uncached_warmup})" in script


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_the_benchmark_says_it_needs_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_decode.py", "--out", "unused.json"])
    with pytest.raises(SystemExit) as error:
        runpy.run_path(str(ROOT / "scripts" / "bench_decode.py"), run_name="__main__")
    assert error.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err
