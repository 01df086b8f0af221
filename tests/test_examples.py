"""The examples run as written: examples/quickstart.py (the README's quickstart), the
simulated serving demo (DeepSeek-V4 and, with --model v4.1, V4.1) and the context-parallel
prefill example under torchrun (2 gloo ranks), on the CPU, each in fresh interpreters."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, timeout=600):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the CPU path, as on a machine without GPU
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_quickstart_runs():
    run = _run(os.path.join(ROOT, "examples", "quickstart.py"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "quickstart on cpu: 6 compressed tokens stored, equal to the reference" in run.stdout


def test_serving_demo_runs():
    run = _run(os.path.join(ROOT, "examples", "serving_demo.py"), "--device", "cpu",
               "--decode-steps", "2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "OK: every compressed token, cache byte and state row matches the reference" in run.stdout


def test_serving_demo_v41_runs():
    run = _run(os.path.join(ROOT, "examples", "serving_demo.py"), "--model", "v4.1",
               "--device", "cpu", "--decode-steps", "3")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert ("OK: every latent, cache byte, index-K byte and ring row matches the reference"
            in run.stdout)


def test_cp_prefill_example_runs_under_torchrun():
    run = _run("-m", "torch.distributed.run", "--nproc-per-node", "2",
               os.path.join(ROOT, "examples", "cp_prefill.py"), "--device", "cpu", "--tokens",
               "640", "--reps", "1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert ("OK: both paths give the same rows and state bytes, equal to the reference"
            in run.stdout)
    assert run.stdout.count(" cr ") == 3  # a row per compressor


def test_readme_quickstart_is_the_example():
    """The README's quickstart block is examples/quickstart.py verbatim, so the code that
    test_quickstart_runs runs is the code a reader pastes."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    marker = "<!-- quickstart: examples/quickstart.py -->\n```python\n"
    assert marker in readme
    block = readme.split(marker, 1)[1].split("```\n", 1)[0]
    with open(os.path.join(ROOT, "examples", "quickstart.py")) as f:
        assert block == f.read()
