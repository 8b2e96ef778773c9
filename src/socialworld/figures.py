"""Figures as the project's HTML pages hold them: matplotlib (headless) drawn to base64 PNGs at one
resolution, so a page is one self-contained file. Used by the bench's reports and the judge audit's page."""

from __future__ import annotations

import base64
import io
from typing import Any

PLOT_DPI = 110
"""figures are drawn at most ~10.4 inches wide: at this dpi they fit the 1200 px page unscaled"""

PAGE_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 12px;color:#222;box-sizing:border-box}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px;max-width:100%}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}figure{margin:.5em 0}"""
"""the tables and figures of every page (the bench's report adds its viewer's rules)"""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display is needed or used)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> str:
    """``fig`` as a base64 PNG at :data:`PLOT_DPI` (closed after)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()
