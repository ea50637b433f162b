"""`calculate` beyond arithmetic: unit and temperature conversions and percentages, in the words people
(and small models copying them) write, with exact values and clear errors (issue 42)."""

from __future__ import annotations

import asyncio

import pytest

from ringlet import RunContext
from ringlet.tools.builtin import calculate


def calc(expression: str) -> str:
    return asyncio.run(calculate.run({"expression": expression}, RunContext(run_id="r", agent="a")))


@pytest.mark.parametrize(("expression", "answer"), [
    ("7 inches to cm", "7 in = 17.78 cm"),
    ("15 inches in centimetres", "15 in = 38.1 cm"),
    ("5 km to miles", "5 km = 3.10686 mi"),
    ("how many km is 13.1 miles", "13.1 mi = 21.0824 km"),
    ("Convert 11 lbs into kg.", "11 lb = 4.98952 kg"),
    ("how many litres in 4 gallons?", "4 gal = 15.1416 L"),
    ("2 cups to ml", "2 cup = 473.176 ml"),
    ("45 mph to kph", "45 mph = 72.4205 km/h"),
    ("100 km/h to m/s", "100 km/h = 27.7778 m/s"),
    ("1 acre to square meters", "1 acre = 4046.86 m2"),
    ("1 week in hours", "1 week = 168 h"),
])
def test_unit_conversions(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize(("expression", "answer"), [
    ("77 degrees fahrenheit to celsius", "77 °F = 25 °C"),
    ("35 c to f", "35 °C = 95 °F"),
    ("15 °C in Fahrenheit", "15 °C = 59 °F"),
    ("-40 f to c", "-40 °F = -40 °C"),
    ("0 kelvin to celsius", "0 K = -273.15 °C"),
    ("212 F to K", "212 °F = 373.15 K"),
])
def test_temperature_conversions(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize(("expression", "answer"), [
    ("15% of 80", "15% of 80 = 12"),
    ("How much is 17.5 percent of 40?", "17.5% of 40 = 7"),
    ("what percent of 250 is 75", "75 is 30% of 250"),
    ("12 is what percent of 48", "12 is 25% of 48"),
    ("what percent is 12 of 48", "12 is 25% of 48"),
    ("20% off 60", "60 minus 20% = 48"),
    ("90 - 10%", "90 minus 10% = 81"),
    ("200 + 15%", "200 plus 15% = 230"),
    ("75% * 120", "90"),
])
def test_percentages(expression: str, answer: str) -> None:
    assert calc(expression) == answer


def test_arithmetic_in_words_and_the_modulo_operator() -> None:
    assert calc("2.5 times 1.6") == "4"
    assert calc("how much is 5 cubed?") == "125"
    assert calc("4,800 / 60") == "80"
    assert calc("2 to the power of 10") == "1024"
    assert calc("10 % 3") == "1"  # `%` between two numbers stays the remainder
    assert calc("17 * 23") == "391"


def test_unknown_units_and_mixed_kinds_are_clear_errors() -> None:
    unknown = calc("5 parsecs to km")
    assert unknown.startswith("cannot convert '5 parsecs to km': unknown unit 'parsecs'; known units:")
    assert "mi" in unknown
    assert "°C" in unknown
    assert calc("5 kg to km") == "cannot convert '5 kg to km': cannot convert mass (kg) to length (km)"
    assert calc("what percent of 0 is 5").startswith("cannot evaluate")
