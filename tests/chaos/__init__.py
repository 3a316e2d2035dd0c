"""Chaos: hostile peers, squatters and broken files against a running tier.

Each test plants one fault a user could meet (or cause) and checks the rule
the tier keeps: a miss, a counter and one log line — never a crash, a wrong
tensor, or a stall past the step budget.
"""
