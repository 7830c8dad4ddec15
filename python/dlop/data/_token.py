"""The trainer side's offload token: from ``token=``, else the file DLOP_OFFLOAD_TOKEN_FILE names
(what ``dlop run`` passes), else DLOP_OFFLOAD_TOKEN. Trailing white space is dropped wherever it
comes from, as dlop-offloader drops it from its --token-file: a token file written by ``echo`` or
an editor ends in a newline, and the daemon's own copy never does."""

from __future__ import annotations

import os

_TRAILING = " \t\n\r\v\f"  # C's isspace(), which the daemon's reader strips


def read_token_file(path: str | os.PathLike) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().rstrip(_TRAILING)


def resolve(token: str | None) -> str:
    """The token to use; "" when none was given anywhere."""
    if token is None:
        path = os.environ.get("DLOP_OFFLOAD_TOKEN_FILE")
        token = read_token_file(path) if path else os.environ.get("DLOP_OFFLOAD_TOKEN", "")
    return token.rstrip(_TRAILING)


MISSING = ("no token was given: pass token=, or set DLOP_OFFLOAD_TOKEN_FILE or DLOP_OFFLOAD_TOKEN "
           "(the daemons' --token-file holds it)")
