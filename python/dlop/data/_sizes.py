"""Image and frame sizes as the dataset makers' ``--size WxH`` gives them (make_dataset and make_video both read it)."""

from __future__ import annotations


def parse_size(text: str | None) -> tuple[int, int] | None:
    """'500x375' -> (500, 375); ValueError otherwise."""
    if text is None:
        return None
    w, sep, h = text.lower().partition("x")
    if not (sep and w.isdigit() and h.isdigit()) or min(int(w), int(h)) < 1:
        raise ValueError(f"{text!r} is not a size like 500x375")
    return int(w), int(h)
