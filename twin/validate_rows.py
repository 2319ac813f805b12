"""The rows of `twin validate`'s table: a published quantity, the twin's prediction of it, and how they compare.

Apart from twin.validate, which computes the predictions, so the table's shape (twin.validate_table renders it)
reads on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One published quantity beside the twin's prediction: a value (with its error), a range or a bound (holds or
    not); the calibrated column is filled in when the fitted machine files are run too."""

    section: str
    quantity: str
    published: str  # as the paper states it
    predicted: float
    unit: str
    kind: str  # value | range | bound
    error: float | None  # value rows: predicted / published - 1
    holds: bool | None  # range and bound rows
    plan: str
    how: str
    calibrated: float | None = None  # the same quantity on the fitted machine files
    calibrated_error: float | None = None  # value rows not fitted on
    calibrated_holds: bool | None = None
    fitted_on: bool = False  # a calibrated file was fitted on this very row


def value_row(section: str, quantity: str, published: float, predicted: float, unit: str, plan: str, how: str,
              shown: str | None = None) -> Row:
    """A published number; its error is predicted / published - 1."""
    return Row(section, quantity, shown or f"{published:g} {unit}", predicted, unit, "value", predicted / published - 1,
               None, plan, how)


def range_row(section: str, quantity: str, lo: float, hi: float, predicted: float, unit: str, plan: str,
              how: str) -> Row:
    """A published range; it holds when the prediction lies inside."""
    return Row(section, quantity, f"{lo:g}-{hi:g} {unit}", predicted, unit, "range", None, lo <= predicted <= hi, plan,
               how)


def bound_row(section: str, quantity: str, text: str, predicted: float, holds: bool, unit: str, plan: str,
              how: str) -> Row:
    """A published bound stated in words (`text`); the caller says whether the prediction keeps it."""
    return Row(section, quantity, text, predicted, unit, "bound", None, holds, plan, how)
