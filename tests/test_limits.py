"""speechrt.limits: the serve flags are the Limits fields, their defaults and their checks."""

import argparse
from dataclasses import replace

import pytest

from speechrt.errors import SpeechRTError
from speechrt.limits import Limits, add_flags, from_flags


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_flags(p.add_argument_group("limits"))
    return p


def test_no_flag_gives_the_defaults_and_each_flag_sets_its_field() -> None:
    assert from_flags(parser().parse_args([])) == Limits()
    args = ["--max-upload-mb", "2", "--request-timeout", "5", "--max-text-chars", "7"]
    want = replace(Limits(), max_upload_bytes=2 * 1024 * 1024, request_timeout_s=5.0)
    assert from_flags(parser().parse_args(args)) == replace(want, max_text_chars=7)


@pytest.mark.parametrize(
    "flag", ["--max-upload-mb", "--max-text-symbols", "--realtime-idle-seconds"]
)
def test_a_limit_that_is_not_positive_names_its_flag(flag: str) -> None:
    with pytest.raises(SpeechRTError, match=f"^{flag} must be positive$"):
        from_flags(parser().parse_args([flag, "0"]))


def test_a_field_without_a_flag_is_checked_too() -> None:
    with pytest.raises(SpeechRTError, match="--max-pieces must be positive"):
        Limits(max_pieces=0)
