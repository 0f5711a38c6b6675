"""The checkers of the exercises in labs/*.ipynb: one module per lab, one function per exercise.

    from ckptlab.exercises import lab01 as exercise
    exercise.sgemm_bytes(my_answer, M=40, N=24, K=56)      # -> right

Each returns a Verdict (verdict.py): "right", "wrong, because ..." or "not answered yet".
"""
