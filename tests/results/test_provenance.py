"""The one provenance type: its word list, the comparison rule, its dict form, and old records' sentences read once
into it (migration on read)."""

from __future__ import annotations

import pytest

from toolkit.core.errors import ToolkitError
from toolkit.core.provenance import KINDS, MARK, Provenance, comparable, from_legacy_text, mark, of_record, stamp


def test_one_word_list_and_a_mark_for_each_kind() -> None:
    assert KINDS == ("measured", "imported", "stand-in", "engine-model", "replayed")
    assert [mark(Provenance(k)) for k in KINDS] == ["measured", "imported", "LAB STAND-IN", "ENGINE MODEL", "REPLAYED"]
    assert mark(Provenance("replayed", "trace.csv"), detail=True) == "REPLAYED (trace.csv)"
    assert Provenance("measured", "NVML").watermark is None and Provenance("stand-in").watermark == MARK["stand-in"]


def test_like_is_compared_only_with_like() -> None:
    lab, model = Provenance("stand-in"), Provenance("engine-model")
    assert comparable(Provenance("measured"), Provenance("measured", "NVML"))
    assert comparable(lab, model)  # the lab's stand-in and its engine model are one model
    assert not comparable(Provenance("imported"), lab)
    assert not comparable(Provenance("measured"), Provenance("replayed"))
    assert not comparable(Provenance("measured"), Provenance("imported"))


def test_the_stamp_of_mixed_sources_names_each_unmeasured_one() -> None:
    assert stamp([Provenance("measured")]) is None
    assert stamp([Provenance("replayed"), Provenance("stand-in"), Provenance("replayed", "x")]) == \
        "LAB STAND-IN + REPLAYED"


def test_dict_form_round_trips_and_refuses_an_unknown_kind() -> None:
    p = Provenance("engine-model", "in-process")
    assert Provenance.from_dict(p.to_dict()) == p
    assert of_record({"provenance": p.to_dict(), "data_source": "measured (NVML)"}) == p  # the typed field wins
    with pytest.raises(ToolkitError, match="'simulated' is not one of"):
        Provenance.from_dict({"kind": "simulated"})


def test_an_old_measured_record_keeps_what_it_was_measured_with() -> None:
    assert from_legacy_text("measured (NVML)") == from_legacy_text("nvml") == Provenance("measured", "NVML")
    assert mark(from_legacy_text("measured (NVML)"), detail=True) == "measured (NVML)"


@pytest.mark.parametrize(("text", "kind"), [
    ("simulated GPUs: the lab's engine model (not measured on a GPU)", "stand-in"),
    ("lab engine model (simulated in-process: no server, no GPU)", "engine-model"),
    ("recorded GPU trace: lab data, not measured on a GPU (trace.csv)", "replayed"),
    ("lab data (stand-in): simulated GPUs: the lab's engine model (not measured on a GPU)", "stand-in"),
    ("lab data (replay): recorded GPU trace: lab data", "replayed"),
    ("lab data (load): GPU figures measured (NVML); the load is not a served model", "measured"),
    ("recorded run", "replayed"),
    ("replayed probe run h200-spin (recorded as: measured (NVML))", "replayed"),
    ("synthetic: shaped from the story's published figures, not measured", "stand-in"),
    ("composed from single-GPU H200 recordings; not measured on 8 GPUs", "replayed"),
    ("something nobody wrote down", "stand-in"),  # never shown as measured unless it said so
])
def test_old_records_sentences_are_read_once_into_the_type(text: str, kind: str) -> None:
    p = of_record({"data_source": text})
    assert p == from_legacy_text(text) and p.kind == kind and p.detail == text
    assert of_record({}).kind == "measured"
    assert of_record({}, {"data_source": text}) == p  # the first record that says

