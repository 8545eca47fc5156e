"""Edge cases of `lipschitz_estimate` and its search helpers, each against an independent oracle.

Added for mutation testing of `attnsvm/lipschitz.py` (issue 13 §4): every test pins a documented
behaviour that an existing test left open.
"""
