"""Linearity: the scaling model calibrated term by term, checked across namespace hosts, reported."""
