"""What a GPU refuses, the exercise check refuses before the emulator builds the file (ckptlab's
own rules, gpu_rules, and NVRTC where installed), each with the learner's line and the reason;
what every shipped kernel does is never refused. A file without the exercise's kernels gets one
line, and a build that takes too long is stopped in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_kernel_exercises import solved

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import gpu_gate, gpu_rules
from ckptlab.exercises.write.check import NO_BUILD
from ckptlab.kernels import nvrtc

ROOT = device.KERNELS_DIR.parent
KERNEL = 'extern "C" __global__ void k(float* x) {\n    x[0] = 1.0f;\n    %s\n}\n'


def refused(text: str) -> list[tuple[int, str]]:
    return [(r.line, r.reason) for r in gpu_rules.refusals(text)]


@pytest.mark.parametrize("path", sorted(device.KERNELS_DIR.glob("*.cu*")), ids=lambda p: p.name)
def test_no_shipped_kernel_or_header_is_refused(path):
    assert refused(path.read_text()) == []


@pytest.mark.parametrize("name", list(write.KERNELS))
def test_no_shipped_exercise_file_or_solution_is_refused(name):
    assert refused(write.shipped_text(name)) == [] and refused(solved(name)) == []


@pytest.mark.parametrize("call", [
    "exit(0);", "std::exit(1);", "_exit(0);", "abort();", 'system("true");', "fork();",
    'popen("ls", "r");', 'FILE* f = fopen("/tmp/x", "w");', 'open("/tmp/x", 0);',
    'write(1, "x", 1);', "execve(0, 0, 0);", 'dlopen("libc.so.6", 2);', "void (*f)(int) = exit;",
    "std::thread t;", 'std::cout << "x";'])
def test_a_host_function_is_refused_at_its_line(call):
    found = refused(KERNEL % call)
    assert found and all(line == 3 for line, _ in found), found
    assert "no GPU has it" in found[0][1]


@pytest.mark.parametrize("code, kind", [('system("true");', "a host function"),
                                        ("std::exit(1);", "a host function"),
                                        ('std::cout << "x";', "host code"),
                                        ("std::thread t;", "host code")])
def test_the_refusal_says_whether_it_is_a_call(code, kind):
    """A call is named as a host function; an object or type a GPU lacks as host code."""
    found = refused(KERNEL % code)
    assert found and f"is {kind}:" in found[0][1], found


def test_a_digit_separator_is_no_character_literal():
    """`1'000` (C++14) opens no character literal: a call later on its line is still seen."""
    assert refused(KERNEL % "int n = 1'000; x[1] = n;") == []
    found = refused(KERNEL % "int n = 1'000; system(\"true\");")
    assert [line for line, _ in found] == [3], found


@pytest.mark.parametrize("fine", [
    'printf("exit(0) %f\\n", x[0]);', "// system(\"rm -rf /\"); fopen()", "/* exit(0); */",
    "int read = 3, write = read; float time = 2.0f; x[1] = read + write + time;",
    "s.write(1); p->exit(2);", "x[1] = expf(x[0]) + fminf(x[0], 2.0f);",
    "char c = '\"'; x[2] = c;"])
def test_comments_strings_device_functions_and_variable_names_are_not_refused(fine):
    assert refused(KERNEL % fine) == []


@pytest.mark.parametrize("header", ["<stdio.h>", "<cstdlib>", "<unistd.h>", "<fstream>",
                                    "<iostream>", "<thread>", "<cmath>", '"../../etc/x.h"',
                                    '"nothere.cuh"'])
def test_a_header_a_gpu_build_cannot_find_is_refused(header):
    found = refused(f"#include {header}\n" + KERNEL % "")
    assert [line for line, _ in found] == [1], found


@pytest.mark.parametrize("header", ['"common.cuh"', "<mma.h>", "<cuda_fp16.h>"])
def test_the_kernels_headers_and_cudas_are_allowed(header):
    assert refused(f"#include {header}\n" + KERNEL % "") == []


@pytest.mark.parametrize("code", ['asm volatile("movl $60, %eax; syscall");', '__asm__("nop");'])
def test_inline_assembly_is_refused(code):
    assert [line for line, _ in refused(KERNEL % code)] == [3]


@pytest.mark.parametrize("prelude, line", [
    ("struct Quit { Quit() { } };\nstatic Quit quit;", 2),
    ("struct Quit { __device__ Quit(int) { } };\n__device__ Quit quit(3);", 2),
    ("struct Quit { Quit() { } } quit;", 1),
    ("\nstatic int pid = getpid();", 2),
    ("__attribute__((constructor)) static void boot() { }", 1),
    ("namespace a { struct Q { Q() {} }; Q q; }", 1)])
def test_code_that_runs_when_the_file_is_loaded_is_refused(prelude, line):
    found = refused(prelude + "\n" + KERNEL % "")
    assert [n for n, _ in found] == [line], found


@pytest.mark.parametrize("prelude", [
    "struct Q { int x; };\nQ make(int a);\nQ other();",  # function declarations
    "__constant__ float table[2] = {1.0f, 2.0f};\nconstexpr int N = sizeof(float) * 2;",
    "struct View v_of(const float* p);"])
def test_declarations_and_constant_globals_are_not_refused(prelude):
    assert refused(prelude + "\n" + KERNEL % "") == []


# ---- the gate: the exercise's kernels, and NVRTC -----------------------------------------------
@pytest.mark.parametrize("make, says", [
    (lambda: "", "no kernel attn_naive_scores in"),
    (lambda: solved("row_softmax"), "no kernel attn_naive_scores in"),
    (lambda: solved("naive_softmax").replace("attn_naive_softmax(", "my_softmax(", 1),
     "no kernel attn_naive_softmax in"),
    (lambda: solved("naive_softmax").replace(
        'extern "C" __global__ void attn_naive_softmax', "__global__ void attn_naive_softmax"),
     'naive_softmax.cu is not extern "C"')])
def test_a_file_without_the_exercises_kernel_gets_one_line(tmp_path, make, says):
    path = tmp_path / "naive_softmax.cu"
    path.write_text(make())
    report = write.check("naive_softmax", file=path)
    assert report.status == NO_BUILD and len(str(report).splitlines()) == 1, str(report)
    assert str(report).startswith(f"{NO_BUILD}: ") and says in str(report), str(report)


def test_a_template_kernel_renamed_is_named_too(tmp_path):
    path = tmp_path / "flash_forward.cu"
    path.write_text(solved("flash_forward").replace(") attn_flash_fwd(", ") fwd(", 1))
    report = write.check("flash_forward", file=path)
    assert str(report).startswith(f"{NO_BUILD}: no kernel attn_flash_fwd in"), str(report)


def test_the_command_says_it_in_one_line_without_a_traceback(tmp_path):
    path = tmp_path / "empty.cu"
    path.write_text("")
    out = subprocess.run([sys.executable, "-m", "ckptlab", "exercise", "check", "flash_forward",
                          "--file", str(path)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 1 and out.stderr == "", (out.stdout, out.stderr)
    assert out.stdout.strip().splitlines() == [out.stdout.strip()]
    assert out.stdout.startswith(f"{NO_BUILD}: no kernel attn_flash_fwd in"), out.stdout


@pytest.mark.skipif(not nvrtc.backend_available("nvrtc"), reason="NVRTC is not installed")
@pytest.mark.parametrize("declared, says", [
    ('extern "C" __device__ void CALL(ex, it)(int);', "exit() exists on no GPU"),
    ("", 'identifier "exit" is undefined')])
def test_nvrtc_refuses_what_the_rules_cannot_see(tmp_path, monkeypatch, declared, says):
    """A host function reached through a macro that pastes its name (declared __device__, or
    not declared: the emulator's shim declares it): the rules see neither; NVRTC finds no such
    function on the device."""
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    code = f"#define CALL(a, b) a##b\n{declared}\n"
    text = solved("naive_softmax").replace('extern "C"', code + 'extern "C"', 1).replace(
        "float m = -INFINITY, l = 0.0f;", "float m = -INFINITY, l = 0.0f; CALL(ex, it)(0);")
    assert refused(text) == []
    now, later = gpu_gate.gate(write.get("naive_softmax"), text, "naive_softmax.cu")
    report = later()
    assert now is None and report is not None and report.status == NO_BUILD, report
    assert "refused by NVRTC" in str(report) and says in str(report), str(report)
    assert not any((tmp_path / "gpu-accepted").iterdir())  # a refusal is never remembered


@pytest.mark.slow
@pytest.mark.skipif(not nvrtc.backend_available("nvrtc"), reason="NVRTC is not installed")
def test_a_file_only_nvrtc_refuses_does_not_build_and_never_runs(tmp_path):
    """NVRTC's refusal stands once g++ has built the file: the library is never loaded."""
    path = tmp_path / "naive_softmax.cu"
    path.write_text(solved("naive_softmax").replace(
        'extern "C"', '#define CALL(a, b) a##b\n__device__ void quit(int) { '
        'CALL(ex, it)(0); }\nextern "C"', 1).replace(
        "float m = -INFINITY, l = 0.0f;", "float m = -INFINITY, l = 0.0f; quit(0);"))
    report = write.check("naive_softmax", file=path)
    assert report.status == NO_BUILD and "refused by NVRTC" in str(report), str(report)


@pytest.mark.slow
def test_a_plain_mistake_is_told_by_the_emulators_compiler_as_before(tmp_path):
    path = tmp_path / "naive_softmax.cu"
    path.write_text(solved("naive_softmax").replace("float m = -INFINITY, l = 0.0f;",
                                                    "float m = -INFINITY, l = 0.0f; m = mm;"))
    report = write.check("naive_softmax", file=path)
    assert report.status == NO_BUILD and "'mm' was not declared" in str(report), str(report)
    assert "GPU" not in str(report)


@pytest.mark.skipif(not nvrtc.backend_available("nvrtc"), reason="NVRTC is not installed")
def test_nvrtc_accepts_every_solution_and_remembers_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    for name in ("naive_softmax", "flash_forward", "wmma_tile"):
        ex = write.get(name)
        assert gpu_gate.nvrtc(ex, solved(name), f"{name}.cu")[1] is None, name
    assert len(list((tmp_path / "gpu-accepted").iterdir())) == 3


@pytest.mark.slow
def test_a_build_past_its_time_limit_is_stopped_in_one_line(tmp_path):
    path = tmp_path / "naive_softmax.cu"
    path.write_text(solved("naive_softmax"))
    out = subprocess.run([sys.executable, "-m", "ckptlab", "exercise", "check", "naive_softmax",
                          "--file", str(path)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT),
                              "CKPTLAB_CACHE_DIR": str(tmp_path / "cache"),
                              "CKPTLAB_EMU_BUILD_TIMEOUT_S": "0.2"}, timeout=300)
    assert out.returncode == 1 and out.stderr == "", (out.stdout, out.stderr)
    assert "did not finish in 0.2 s and was stopped" in out.stdout, out.stdout
    assert "Traceback" not in out.stdout and "$ " not in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(not nvrtc.backend_available("nvrtc"), reason="NVRTC is not installed")
def test_without_libnvrtc_by_ctypes_the_binding_and_ptxas_say_the_same(tmp_path, monkeypatch):
    from ckptlab.kernels import nvrtc_lib

    def no_library():
        raise OSError("none here")

    monkeypatch.setattr(nvrtc_lib, "load", no_library)
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    ex = write.get("naive_softmax")
    assert gpu_gate.nvrtc(ex, solved("naive_softmax"), "naive_softmax.cu")[1] is None
    text = solved("naive_softmax").replace(
        'extern "C"', '#define CALL(a, b) a##b\nextern "C" __device__ void CALL(ex, it)(int);\n'
        'extern "C"', 1).replace("float m = -INFINITY, l = 0.0f;",
                                 "float m = -INFINITY, l = 0.0f; CALL(ex, it)(0);")
    label, log = gpu_gate.nvrtc(ex, text, "naive_softmax.cu")
    assert "Unresolved extern function 'exit'" in log, log


@pytest.mark.skipif(not nvrtc.backend_available("nvrtc"), reason="NVRTC is not installed")
def test_an_acceptance_others_could_plant_is_not_believed(tmp_path, monkeypatch):
    """NVRTC's acceptances are kept where the emulator keeps its libraries, under the same
    rules: in a folder others can write, a planted one is not believed."""
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    ex = write.get("naive_softmax")
    text = solved("naive_softmax").replace(
        'extern "C"', '#define CALL(a, b) a##b\nextern "C"', 1).replace(
        "float m = -INFINITY, l = 0.0f;", "float m = -INFINITY, l = 0.0f; CALL(ex, it)(0);")
    options = ["-std=c++17", f"-I{device.KERNELS_DIR}", *nvrtc.cuda_include_options()]
    planted = gpu_gate._ok_path(text, "naive_softmax.cu", gpu_gate._installed(), options,
                                gpu_gate._expressions(ex))
    planted.touch()
    assert gpu_gate.nvrtc(ex, text, "naive_softmax.cu")[1] is None  # yours: believed
    os.chmod(planted.parent, 0o777)
    assert gpu_gate.nvrtc(ex, text, "naive_softmax.cu")[1] is not None
