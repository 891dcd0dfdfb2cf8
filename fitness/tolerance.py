"""How far a candidate's logits are from the reference's, in tolerances.

The error of a call is max |s - r| / (atol + rtol * |r|): 1.0 is the evaluator's limit.
"""
ATOL = RTOL = 1e-2


def error_ratio(student, reference, past=None) -> float:
    """Worst |s - r| / (atol + rtol |r|), each |s - r| counted past `past` where given (what a
    routing flip elsewhere may move it by: fitness.reference_logits); inf for NaN or inf in
    the student's logits."""
    s, r = student.float().cpu(), reference.float().cpu()
    error = (s - r).abs() if past is None else ((s - r).abs() - past).clamp(min=0)
    worst = in_tolerances(error, r)
    return float("inf") if worst != worst else worst


def in_tolerances(difference, reference) -> float:
    """Worst |difference| / (atol + rtol |reference|): how many tolerances it spans (NaN as is)."""
    ratio = difference.abs() / (ATOL + RTOL * reference.abs())
    return ratio.max().item() if ratio.numel() else 0.0
