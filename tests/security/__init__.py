"""Attacks replayed against the operator: each test names the attack and what the operator answers."""
