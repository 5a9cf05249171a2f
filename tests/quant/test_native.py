"""quant/native and the "onednn-u8" kernel: lmforge's per-row activation quantisation, built once with
gcc, and the int8 product fed with its bytes."""
import functools
import subprocess
import sys

import pytest
import torch

from lmforge.quant import engines, int8, native

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="the native kernel is not built here (no gcc, or no libgomp in torch)")


def _rows(rows=37, cols=96, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(rows, cols) * (torch.rand(rows, 1) * 4 + 0.01)
    x[5] = x[5].abs()  # no negative value
    x[9] = 0.0  # an all-zero row
    return x


@pytest.mark.parametrize("levels", [63, 127])
def test_each_row_is_quantised_by_its_own_peak(levels):
    x, inv = _rows(), torch.rand(96) + 0.5
    for scale in (None, inv):
        q, peak = native.quantise_rows(x, scale, levels, levels + 1)
        scaled = x if scale is None else x * scale
        assert torch.equal(peak[:, 0], scaled.abs().amax(dim=1).clamp(min=1e-30))
        assert int(q.min()) >= 1 and int(q.max()) <= 2 * levels + 1
        back = (q.float() - (levels + 1)) / levels * peak  # within half a step of every value
        assert ((back - scaled).abs() <= peak / levels * 0.5 + 1e-6).all()
        assert (q[9] == levels + 1).all()  # zero stays exactly zero


def test_rows_are_independent_of_their_batch_and_of_the_thread_count():
    x = _rows(rows=2000, cols=64)  # over the size from which rows are split between threads
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # split in any run (OMP_NUM_THREADS=1 too), into uneven parts
    try:
        q, peak = native.quantise_rows(x, None, 63, 64)
    finally:
        torch.set_num_threads(threads)
    alone = [native.quantise_rows(x[i:i + 1], None, 63, 64) for i in (0, 777, 1999)]
    for (q_alone, peak_alone), i in zip(alone, (0, 777, 1999)):
        assert torch.equal(q_alone[0], q[i]) and torch.equal(peak_alone[0], peak[i])
    torch.set_num_threads(1)
    try:
        serial = native.quantise_rows(x, None, 63, 64)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(serial[0], q) and torch.equal(serial[1], peak)


def test_a_non_finite_row_gets_a_non_finite_peak_and_spoils_no_other_row():
    x = _rows()
    x[2, 7], x[4, 0] = float("nan"), float("-inf")
    q, peak = native.quantise_rows(x, None, 63, 64)
    assert peak[2].isnan().all() and peak[4].isinf().all() and (q[2] == 64).all()
    clean = torch.cat([x[:2], x[5:]])
    assert torch.equal(torch.cat([peak[:2], peak[5:]]), native.quantise_rows(clean, None, 63, 64)[1])


def test_the_kernel_agrees_with_fp32_and_a_non_finite_row_comes_out_nan():
    assert engines.u8_usable()
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    layer = int8.Int8Linear.from_linear(linear, "dynamic", smooth=torch.rand(96) + 0.5).eval()
    assert engines.U8 in layer.candidates()
    x = _rows()
    with torch.no_grad():
        out, ref = layer.run(engines.U8, x), linear(x)
        assert (out - ref).norm() < 0.03 * ref.norm()
        x[3, 1] = float("nan")
        out = layer.run(engines.U8, x)
    assert out[3].isnan().all() and torch.isfinite(torch.cat([out[:3], out[4:]])).all()


@pytest.mark.slow  # a process start each; the suite's fast half keeps the property's other tests
def test_the_library_is_built_once_and_kept(tmp_path):
    code = ("from lmforge.quant import native; import sys; "
            "sys.exit(0 if native.library() is not None else 1)")
    env = {"LMFORGE_NATIVE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    built = list(tmp_path.glob(f"{native.NAME}-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob(f".{native.NAME}-*"))  # no temporary file left
    first = built[0].stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    # read back, not rebuilt (nor a second one built beside it)
    assert built[0].stat().st_mtime_ns == first and list(tmp_path.glob(f"{native.NAME}-*.so")) == built


@pytest.fixture
def fresh_library(monkeypatch):
    """native.library with a cache of its own for the test: the process's loaded library stays as it was
    for the tests after (engines.u8_usable has already said yes to it)."""
    fresh = functools.cache(native.library.__wrapped__)
    monkeypatch.setattr(native, "library", fresh)
    return fresh


def test_off_and_a_failed_build_leave_the_kernel_out_said_once(tmp_path, monkeypatch, capsys, fresh_library):
    monkeypatch.setenv(native.ENV, "off")
    assert fresh_library() is None
    monkeypatch.setenv(native.ENV, str(tmp_path))
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCES", (broken,))
    fresh_library.cache_clear()
    assert fresh_library() is None and fresh_library() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{native.NAME} not built (gcc: " in err and "broken.c" in err
    assert "int8 runs without" in err


def test_an_input_the_c_code_would_misread_is_refused():
    x = _rows()
    wrong = [(x.double(), None), (x.bfloat16(), None), (x.view(37, 8, 12), None), (x, torch.ones(8)),
             (x, torch.ones(96, dtype=torch.float64))]
    for bad_x, bad_inv in wrong:  # read as raw fp32: wrong values, or past the end of the memory
        with pytest.raises(ValueError, match="x: |inv: "):
            native.quantise_rows(bad_x, bad_inv, 63, 64)
    with pytest.raises(ValueError, match="levels"):
        native.quantise_rows(x, None, 128, 128)
    inv = (torch.rand(192) + 0.5)[::2]  # a strided view: read as its values, not every other one
    assert all(torch.equal(a, b) for a, b in zip(native.quantise_rows(x, inv, 63, 64),
                                                   native.quantise_rows(x, inv.contiguous(), 63, 64)))


def test_without_the_library_the_product_says_so(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: None)
    with pytest.raises(RuntimeError, match="not loaded"):
        native.quantise_rows(_rows(), None, 63, 64)


@pytest.mark.slow  # a process start each; the suite's fast half keeps the property's other tests
@pytest.mark.parametrize("case", ["no gcc", "a file"])
def test_no_gcc_or_a_file_for_a_folder_is_said_once_and_int8_runs_its_other_kernels(case, tmp_path):
    code = ("import torch; from lmforge.quant import engines, int8; "
            "layer = int8.Int8Linear.from_linear(torch.nn.Linear(64, 32), 'dynamic').eval(); "
            "torch.set_grad_enabled(False); out = layer(torch.randn(4, 64)); "
            "assert engines.U8 not in layer.candidates() and out.isfinite().all()")
    (tmp_path / "a-file").write_text("not a folder\n")
    env = {"LMFORGE_NATIVE": str(tmp_path / "a-file") if case == "a file" else str(tmp_path),
           "PATH": "/nonexistent" if case == "no gcc" else "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "LMFORGE_INT8_KERNELS": "off"}
    done = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    said = "no gcc on PATH" if case == "no gcc" else "File exists"
    assert done.stderr.count("\n") == 1 and said in done.stderr and "LMFORGE_NATIVE" in done.stderr


def test_a_second_openmp_runtime_is_refused_said_once(monkeypatch, capsys, fresh_library):
    # torch's libgomp under another soname (a wheel's renamed copy): loading the library maps the system's
    maps = iter([{"/torch/lib/libgomp-1a2b.so.1"}, {"/torch/lib/libgomp-1a2b.so.1", "/usr/lib/libgomp.so.1"}])
    monkeypatch.setattr(native, "_gomp_files", lambda: next(maps))
    assert fresh_library() is None and fresh_library() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "second OpenMP runtime beside torch's: ['/usr/lib/libgomp.so.1']" in err


def test_another_librarys_own_openmp_runtime_does_not_stop_it(monkeypatch, capsys, fresh_library):
    # scikit-learn's wheel maps its own renamed libgomp beside torch's: the library still links torch's
    both = {"/torch/lib/libgomp.so.1", "/sklearn.libs/libgomp-e985bcbb.so.1.0.0"}
    monkeypatch.setattr(native, "_gomp_files", lambda: set(both))
    assert fresh_library() is not None and capsys.readouterr().err == ""
