"""carpool.SamplingParams: checked once when made, sent as set."""

import dataclasses
import math

import pytest

import carpool


def test_defaults_leave_every_optional_field_unset():
    s = carpool.SamplingParams()
    assert (s.max_tokens, s.temperature, s.top_k, s.top_p, s.seed) == (None,) * 5
    assert (s.stop_token_ids, s.ignore_eos, s.logprobs) == ((), False, 0)


def test_values_are_normalized():
    s = carpool.SamplingParams(temperature=1, stop_token_ids=[3, 4], seed=(1 << 64) - 1)
    assert isinstance(s.temperature, float) and s.temperature == 1.0
    assert s.stop_token_ids == (3, 4)  # a tuple: the params stay immutable
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 2.0


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", 1 << 31), ("top_k", -2), ("seed", -1), ("seed", 1 << 64),
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", math.nan),
    ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1), ("min_p", 1.1),
    ("repetition_penalty", 0.0), ("presence_penalty", 2.5), ("frequency_penalty", -2.5),
    ("logprobs", -1), ("logprobs", 21), ("stop_token_ids", [-1]),
])
def test_out_of_range_is_invalid_argument_naming_the_field(field, value):
    with pytest.raises(carpool.InvalidArgument) as info:
        carpool.SamplingParams(**{field: value})
    assert field in info.value.message


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 1.5), ("max_tokens", True), ("temperature", "hot"), ("top_k", "4"),
    ("stop_token_ids", ["x"]), ("stop_token_ids", 5), ("ignore_eos", 1), ("logprobs", None),
])
def test_wrong_types_are_type_errors(field, value):
    with pytest.raises(TypeError):
        carpool.SamplingParams(**{field: value})


def test_replace_checks_again():
    s = carpool.SamplingParams(max_tokens=4)
    assert dataclasses.replace(s, temperature=0).temperature == 0.0
    with pytest.raises(carpool.InvalidArgument):
        dataclasses.replace(s, max_tokens=0)


def test_generate_takes_only_sampling_params(fake_router, client):
    with pytest.raises(TypeError):
        client.generate("a", sampling={"max_tokens": 2})
    with pytest.raises(TypeError):  # the sampling fields are no keywords of generate
        client.generate("a", max_tokens=2)
    with pytest.raises(carpool.InvalidArgument):
        client.generate("a", sampling=carpool.SamplingParams(max_tokens=0))
    assert fake_router.messages("generate") == []
    client.generate("a", sampling=carpool.SamplingParams(max_tokens=2, temperature=0))
    s = fake_router.messages("generate")[0].generate.sampling
    assert s.max_tokens == 2 and s.HasField("temperature") and s.temperature == 0
    assert not s.HasField("top_p")
