"""The shape of the loop and the worker around it (issue 32, items 1 and 3): what a reviewer would count by hand."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_scaling_driver_keeps_only_bookkeeping() -> None:
    # The composed law is controllers/scaling_law.py; the driver keeps per-key state and makes commands.
    driver = (ROOT / "loop" / "scaler_driver.py").read_text()
    assert driver.count("\n") <= 300
    assert "from controllers import scaling_law" in driver
