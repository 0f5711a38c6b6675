"""The exercise checker's messages without a compiler: a compiler's output told against the
learner's file (which error is shown, the caret under its column, how many more there were), a
fault's hint key, and which hint a pattern gets (an exercise's own first, the grade clamped)."""

from ckptlab.exercises.write import feedback, hints

TEXT = "int main() {\n    int a = pvv;\n    return a;\n}\n"  # the learner's file, 4 lines
SHOWN = "labs/exercises/flash_forward.cu"


def test_the_first_error_in_the_learners_file_comes_before_a_headers():
    msg = ("/tmp/b/common.cuh:10:3: error: 'x' does not name a type\n"
           "/tmp/b/flash_forward.cu:2:13: error: 'pvv' was not declared in this scope\n"
           "/tmp/b/flash_forward.cu:3:5: error: something else\n")
    out = feedback.compile_report(msg, SHOWN, TEXT)
    assert out[0] == f"your kernel does not build: {SHOWN}:2: 'pvv' was not declared in this scope"
    # 3 errors: the one shown and 2 more
    assert out[-1].startswith("(2 more errors after this one;"), out
    one = feedback.compile_report("/tmp/b/flash_forward.cu:2:13: error: x\n", SHOWN, TEXT)
    assert not any("more error" in ln for ln in one), one
    two = feedback.compile_report("f.cu:1:1: error: a\nf.cu:2:1: error: b\n", SHOWN, TEXT)
    assert two[-1].startswith("(1 more error after this one;"), two


def test_the_caret_sits_under_the_errors_column():
    # column 13 of "    int a = pvv;" is the 'p' of pvv (4 spaces, "int a = " is 8 more)
    out = feedback.compile_report("x/flash_forward.cu:2:13: error: 'pvv' was not declared\n",
                                  SHOWN, TEXT)
    line = next(ln for ln in out if " > " in ln)
    caret = next(ln for ln in out if ln.strip() == "^")
    assert line[caret.index("^"):].startswith("pvv"), (line, caret)


def test_a_fault_gets_its_kinds_hint_key():
    class Err(Exception):
        def __init__(self, kind, text):
            super().__init__(text)
            self.kind = kind

    assert feedback.fault_pattern(Err("race", "global-memory race on y[3]")) == "global_race"
    assert feedback.fault_pattern(Err("race", "shared-memory race at s[3]")) == "race"
    assert feedback.fault_pattern(Err("access", "out of bounds")) == "access"
    assert feedback.fault_pattern(Err(None, "something")) == "fault"


def test_an_exercises_hint_for_the_output_comes_first_and_the_grade_is_clamped():
    own = {("O", "factor"): ("for O, 1", "for O, 2"), "factor": ("any, 1", "any, 2")}
    assert hints.hint(own, "O", "factor", 1) == "for O, 1"
    assert hints.hint(own, "L", "factor", 2) == "any, 2"
    assert hints.hint({}, "O", "factor", 0) == hints.GENERIC["factor"][0]  # below 1: the first
    assert hints.hint({}, "O", "factor", 7) == hints.GENERIC["factor"][1]


def test_an_element_pattern_maps_to_its_family():
    assert hints.family("tail_r") == "tail"  # in FAMILY
    assert hints.family("tail_x") == "tail"  # not in FAMILY: by its prefix
    assert hints.family("part_q") == "part"
    assert hints.family("after_first_tile_i") == "multi_tile"
    assert hints.family("whatever") == "everywhere"
