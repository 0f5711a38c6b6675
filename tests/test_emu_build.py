"""The emulator's build cache: keyed by everything that affects the binary, shared safely by
processes that build the same module at the same moment, and the source rewrites it relies on."""

import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from ckptlab import emu
from ckptlab.emu import build

KERNEL = 'extern "C" __global__ void fill(float* x, float v) {{ x[threadIdx.x] = v; }} // {tag}\n'


@pytest.mark.slow  # builds modules from scratch: 5-30 s
def test_two_processes_building_the_same_module_at_once(tmp_path):
    tag = uuid.uuid4().hex  # a module nobody has built yet
    script = textwrap.dedent(f"""
        import numpy as np
        from ckptlab import emu
        code = {KERNEL.format(tag=tag)!r}
        f = emu.RawModule(code=code, name="race.cu").get_function("fill")
        x = np.zeros(8, np.float32)
        f((1,), (8,), (x, np.float32(3)))
        assert (x == 3).all()
        print("ok")
    """)
    env = dict(os.environ, CKPTLAB_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "ok", err
    libraries = sorted(f.name for f in tmp_path.glob("race.cu-counted-*.so"))
    assert len(libraries) == 1  # one build, three users
    assert not list(tmp_path.glob("tmp*"))  # no half-written leftovers


@pytest.mark.slow  # builds modules from scratch: 5-30 s
def test_cache_key_changes_with_the_source_and_the_options(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    a = build.build_module(KERNEL.format(tag="a"), "k.cu", ["fill"], (), "fast")
    b = build.build_module(KERNEL.format(tag="b"), "k.cu", ["fill"], (), "fast")
    c = build.build_module(KERNEL.format(tag="a"), "k.cu", ["fill"], ("-DX=1",), "fast")
    again = build.build_module(KERNEL.format(tag="a"), "k.cu", ["fill"], (), "fast")
    assert len({a, b, c}) == 3 and again == a


@pytest.mark.slow  # builds modules from scratch: 5-30 s
def test_a_header_change_rebuilds(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path / "cache"))
    inc = tmp_path / "inc"
    inc.mkdir()
    code = '#include "v.cuh"\nextern "C" __global__ void f(float* x) { x[0] = V; }\n'
    values = []
    for v in (1, 2):
        (inc / "v.cuh").write_text(f"#define V {v}.0f\n")
        f = emu.RawModule(code=code, options=(f"-I{inc}",), name="hdr.cu").get_function("f")
        x = np.zeros(1, np.float32)
        f((1,), (1,), (x,))
        values.append(float(x[0]))
    assert values == [1.0, 2.0]


def test_rewrites_keep_line_numbers():
    src = ("__shared__ float a[4], b[2][3];\n"
           "extern __shared__ __align__(16) float dyn[];\n"
           "__shared__ int s;\n"
           "__device__ unsigned counter;\n"
           "__device__ float table[3] = {1.0f,\n 2.0f, 3.0f};\n"
           "__device__ float twice(float x) { return 2 * x; }\n")
    out = build.rewrite_source(src)
    assert out.count("\n") == src.count("\n")
    assert 'emu_shared_declare(sizeof(float[4]), alignof(float) > 16 ? alignof(float) : 16, "a")' \
        in out
    assert ("float (&a)[4] = *emu_launder(reinterpret_cast<float(*)[4]>(emu_shared_at("
            "emu_shared_a)));") in out
    assert "float (&b)[2][3] = *emu_launder(reinterpret_cast<float(*)[2][3]>(emu_shared_at(" in out
    assert "float* dyn = reinterpret_cast<float*>(emu_dynamic_shared());" in out
    assert "int (&s) = *emu_launder(reinterpret_cast<int(*)>(emu_shared_at(emu_shared_s)));" in out
    assert "static unsigned emu_device_init_counter ;" in out
    assert "static float emu_device_init_table[3] = {1.0f,  2.0f, 3.0f};" in out
    assert 'emu_device_object(&emu_device_init_table, sizeof(emu_device_init_table), ' \
           'alignof(float), "table")' in out
    assert "__device__ float twice(float x)" in out  # functions stay as they are


def test_kernel_names_ignore_comments():
    code = ('// extern "C" __global__ void old(float* x) {}\n'
            'extern "C" __global__ void __launch_bounds__(128) new_one(float* x) {}\n'
            '/* extern "C" __global__ void gone() {} */\n')
    assert emu.kernel_names(code) == ["new_one"]
