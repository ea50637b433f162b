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
    ("12 inches to cm", "12 in = 30.48 cm"),
    ("10 inches in centimeters", "10 in = 25.4 cm"),
    ("5 km to miles", "5 km = 3.10686 mi"),
    ("how many km is 26.2 miles", "26.2 mi = 42.1648 km"),
    ("Convert 5 pounds to kilograms.", "5 lb = 2.26796 kg"),
    ("how many liters are in 3 gallons?", "3 gal = 11.3562 L"),
    ("2 cups to ml", "2 cup = 473.176 ml"),
    ("60 mph in km/h", "60 mph = 96.5606 km/h"),
    ("100 km/h to m/s", "100 km/h = 27.7778 m/s"),
    ("1 acre to square meters", "1 acre = 4046.86 m2"),
    ("1 week in hours", "1 week = 168 h"),
])
def test_unit_conversions(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize(("expression", "answer"), [
    ("100 degrees fahrenheit in celsius", "100 °F = 37.7778 °C"),
    ("20 c to f", "20 °C = 68 °F"),
    ("20 °C to Fahrenheit", "20 °C = 68 °F"),
    ("-40 f to c", "-40 °F = -40 °C"),
    ("0 kelvin to celsius", "0 K = -273.15 °C"),
    ("212 F to K", "212 °F = 373.15 K"),
])
def test_temperature_conversions(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize(("expression", "answer"), [
    ("15% of 80", "15% of 80 = 12"),
    ("What is 12.5 percent of 64?", "12.5% of 64 = 8"),
    ("what percent of 80 is 20", "20 is 25% of 80"),
    ("12 is what percent of 48", "12 is 25% of 48"),
    ("what percent is 12 of 48", "12 is 25% of 48"),
    ("30% off 40", "40 minus 30% = 28"),
    ("40 - 30%", "40 minus 30% = 28"),
    ("200 + 15%", "200 plus 15% = 230"),
    ("25% * 360", "90"),
])
def test_percentages(expression: str, answer: str) -> None:
    assert calc(expression) == answer


def test_arithmetic_in_words_and_the_modulo_operator() -> None:
    assert calc("3.2 times 2.5") == "8"
    assert calc("What is 9 cubed?") == "729"
    assert calc("7,200 / 90") == "80"
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
