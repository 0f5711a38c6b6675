"""The markers of the lines a learner writes (ckptlab.exercises.write.regions) on small texts:
a `// <<<` closes only the region of its own name and step, a YOUR CODE block ends only at its
own step's end, and "not attempted" ignores blank lines and spaces around a line."""

import pytest

from ckptlab.exercises.write import regions


def test_an_end_marker_closes_only_its_own_step():
    with pytest.raises(regions.MarkerError, match="line 3: '// <<< x 2' closes no region"):
        regions.regions("// >>> x 1: a\nint a;\n// <<< x 2\n")
    (r,) = regions.regions("// >>> x 1: a\nint a;\n// <<< x 1\n")
    assert (r.name, r.step, r.title, r.first, r.last, r.body) == ("x", 1, "a", 0, 2, ("int a;",))


def test_a_your_code_block_ends_at_its_own_steps_end():
    text = ("// >>> YOUR CODE, step 1 of 2: first\nint a;\n// <<< end of step 2\n"
            "// >>> YOUR CODE, step 2 of 2: second\nint b;\n// <<< end of step 2\n")
    (s,) = regions.steps(text)  # step 1 is never closed: only step 2 is a block
    assert (s.step, s.of, s.title, s.begin, s.end, s.body) == (2, 2, "second", 4, 6, ("int b;",))


def test_not_attempted_ignores_blank_lines_and_spaces_around_a_line():
    shipped = "a;\n    b;\n// >>> YOUR CODE, step 1 of 1: t\nint x = 0;\n// <<< end of step 1\n"
    assert regions.not_attempted(shipped.replace("    b;", "\tb;   \n\n"), shipped)
    assert regions.untouched_steps(shipped.replace("int x = 0;", "  int x = 0;  \n"), shipped) \
        == [1]
    assert not regions.not_attempted(shipped.replace("int x = 0;", "int x = 1;"), shipped)
