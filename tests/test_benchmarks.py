"""The benchmark runner end to end on tiny shapes (`benchmarks/run.py --smoke --device cpu`):
every family's script runs, every row is measured without an error or a failed output check,
and the table is written. Timings are not asserted: performance targets live in benchmarks/."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_runner_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--smoke",
                          "--device", "cpu", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["family"] for r in rows} >= {"plan", "compress", "store", "step"}
    assert {r["op"] for r in rows} >= {
        "plan_decode", "plan_prefill_hostlens", "plan_prefill_devlens", "compress_decode",
        "compress_prefill", "store_decode", "store_prefill", "decode_step"}
    bad = [(r["case"], r["op"], r["error"], r.get("check")) for r in rows
           if r["error"] or r.get("check") not in (None, "ok")]
    assert not bad, bad
    assert all(r["time_us"] > 0 for r in rows)
    # Every output check that the scripts make ran on some row of each op family.
    assert {r["family"] for r in rows if r.get("check") == "ok"} >= {"plan", "compress", "store"}
    table = (tmp_path / "results.md").read_text()
    assert "compress_prefill" in table and "store_decode" in table
