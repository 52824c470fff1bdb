"""A property-based fuzz of the job model (issue 11): any JSON-like document either parses into a
job that keeps every rule, or is refused with the model's own error (``SpecError``) — never
another exception, never a job whose numbers or names break the rules.

Two generators: arbitrary JSON-like values (anything a body, a DAG run's conf or a peer may send),
and job-shaped documents whose every field is drawn from good values and hostile ones (huge and
non-finite numbers, booleans, control characters, surrogates, reserved names, colliding files), so
the fuzz reaches every validator instead of stopping at a missing ``job_id``. The rules are
restated here, independently of the code under test.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import JobSpec, parse_job

TiB = 2**40

# Text from every Unicode category, surrogates and control characters included.
any_text = st.text(st.characters(codec=None, categories=None), max_size=12)
hostile_text = st.sampled_from(
    [
        "",
        ".",
        "..",
        "/",
        "a/b",
        "a\x00b",
        "\x1b[2J",
        "tab\there",
        "line\nbreak",
        "\ud800",
        "\u202e",
        " ",
        "é",
        "x" * 300,
    ]
)
texts = st.one_of(any_text, hostile_text, st.sampled_from(["a", "h100", "us-east", "train.py", "ok"]))

numbers = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 8, 256, 257, 4096, 4097, 1e6, 10**9, 10**400, 1e30, 1.5, 2**53 + 1, 2**63]),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "1e30", "7", "16Gi", "33Ti", "9" * 50 + "Gi", " 12 ", "0x10"]),
    st.booleans(),
)

json_like = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=16,
)

# Good values of each field (boundaries included) ...
names = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
segments = st.from_regex(r"[A-Za-z0-9_:+@-][A-Za-z0-9._:+@-]{0,10}", fullmatch=True).filter(lambda s: ".." not in s)
plain_text = st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")) | st.sampled_from("\t\n"), max_size=20)
good_device = st.one_of(
    st.just({"type": "cpu"}),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["gpu", "GPU"]),
            "variant": st.sampled_from(["h100", "a100", "v5p-8", "auto", " H100 "]),
            "count": st.integers(1, 256) | st.sampled_from([1, 8, 256]),
        }
    ),
    st.fixed_dictionaries({"type": st.just("tpu"), "variant": st.just("auto"), "count": st.integers(1, 256)}),
    # A concrete TPU variant: its count is the slice's chips per host, or left out.
    st.sampled_from(["v5p-8", "v5p-16", " V6E-16 ", "v5e-8", "v4-32"]).map(lambda v: {"type": "tpu", "variant": v}),
)
good = {
    "job_id": st.lists(segments, min_size=2, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    "command": plain_text | st.lists(plain_text, max_size=4),
    "image": st.sampled_from(["", "ubuntu:22.04", "ghcr.io/marin/train@sha256:abc"]),
    "env": st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("IRIS_")),
        plain_text,
        max_size=3,
    ),
    "files": st.dictionaries(
        st.lists(segments, min_size=1, max_size=3).map("/".join),
        plain_text | st.sampled_from(["base64:AAE=", "base64:"]),
        max_size=4,
    ),
    "resources": st.fixed_dictionaries(
        {},
        optional={
            "device": good_device,
            "replicas": st.integers(1, 4096) | st.sampled_from([1, 4096, "2"]),
            "cpu": st.floats(0, 1024) | st.sampled_from([0, 1024, "0.5"]),
            "memory": st.integers(0, 32 * 2**40) | st.sampled_from(["16Gi", "32Ti", "512Mi", 1.5]),
        },
    ),
    "constraints": st.lists(
        st.sampled_from(
            [
                {"key": "zone", "op": "EQ", "value": "us-east-02a"},
                {"key": "gpu-count", "op": "GE", "values": [8]},
                {"key": "region", "op": "EXISTS"},
                {"key": "preemptible", "op": "EQ", "value": True},
            ]
        ),
        max_size=2,
    ),
    "regions": st.none() | st.lists(names, min_size=1, max_size=3) | st.just(["*"]),
    "prefer": st.lists(st.sampled_from(["h100", "A100", "v5p-8", "zz9"]), max_size=3),
    "priority_band": st.sampled_from(["batch", "PRIORITY_BAND_PRODUCTION", "interactive", "priority"]),
    "target_cluster": st.none() | names,
    "scheduling_deadline_ms": st.none() | st.integers(0, 4_102_444_800_000),
}
# ... and hostile ones.
job_ids = st.one_of(
    st.sampled_from(["/../..", "/a/./b", "/a//b", "/a", "a/b", "/a/b\x00", "/a/" + "x" * 600]),
    st.builds(lambda a, b: f"/{a}/{b}", texts, texts),
)
device = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["cpu", "gpu", "tpu", "GPU", "fpga"]) | texts,
        "variant": texts,
        "count": numbers,
    },
)
env_names = st.one_of(st.sampled_from(["PATH", "IRIS_JOB_NONCE", "IRIS_X", "iris_x", "1BAD", "A_B"]), texts)
file_names = st.one_of(st.sampled_from(["a", "a/b", "a/b/c", "run.sh", "./x", "x/../y", "/abs", "a\\b"]), texts)
constraint = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["zone", "region", "gpu-count", "preemptible", "cluster", "custom"]) | texts,
        "op": st.sampled_from(["EQ", "IN", "GE", "EXISTS", "NE"]) | texts,
    },
    optional={"values": st.lists(numbers | texts, max_size=3), "value": numbers | texts},
)
hostile = {
    "job_id": job_ids,
    "command": texts | st.lists(texts, max_size=4) | json_like,
    "image": texts | numbers,
    "env": st.dictionaries(env_names, texts | numbers, max_size=3),
    "files": st.dictionaries(file_names, texts | st.sampled_from(["base64:AAE=", "base64:%%"]), max_size=4),
    "resources": st.fixed_dictionaries(
        {}, optional={"device": device | json_like, "replicas": numbers, "cpu": numbers, "memory": numbers}
    )
    | json_like,
    "constraints": st.lists(constraint | json_like, max_size=3),
    "regions": st.lists(texts, max_size=3) | json_like,
    "prefer": st.lists(texts, max_size=20) | json_like,
    "priority_band": texts | numbers,
    "target_cluster": texts | numbers,
    "parent_job_id": job_ids | json_like,
    "scheduling_deadline_ms": numbers | json_like,
    "unknown": json_like,
}


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A job whose fields are good, but for up to three drawn from hostile values."""
    document = {"job_id": draw(good["job_id"])}
    for field in draw(st.lists(st.sampled_from(sorted(good)), max_size=len(good), unique=True)):
        document[field] = draw(good[field])
    for field in draw(st.lists(st.sampled_from(sorted(hostile)), max_size=3, unique=True)):
        document[field] = draw(hostile[field])
    return document


def parsed_or_refused(document: Any) -> JobSpec | None:
    """The job, or None when the model refused it with its own error (anything else fails the test)."""
    try:
        return parse_job(document)
    except SpecError as error:
        if not error.problems:
            raise AssertionError("a refusal names at least one field") from error
        # Safe to log and to send as JSON: valid UTF-8, no control characters but its line breaks.
        message = str(error)
        message.encode("utf-8")
        if not all(clean_name(line) for line in message.split("\n")):
            raise AssertionError(f"a refusal echoes a control character: {message!r}") from error
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_like)
def test_any_json_like_value_parses_into_a_valid_job_or_is_refused_with_a_spec_error(document: Any) -> None:
    job = parsed_or_refused(document)
    if job is not None:
        keeps_every_rule(job)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_any_job_document_parses_into_a_valid_job_or_is_refused_with_a_spec_error(document: dict[str, Any]) -> None:
    job = parsed_or_refused(document)
    if job is not None:
        keeps_every_rule(job)


# The rules, restated -----------------------------------------------------------------------------------

JOB_ID = re.compile(r"(/[A-Za-z0-9._:+@-]+){2,}")
REFUSED_IN_NAMES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def clean_name(text: str) -> bool:
    return not any(unicodedata.category(c) in REFUSED_IN_NAMES for c in text)


def clean_text(text: str) -> bool:
    return not any(unicodedata.category(c) in {"Cc", "Cs", "Zl", "Zp"} and c not in "\t\n" for c in text)


def within(value: Any, low: float, high: float) -> bool:
    return not isinstance(value, bool) and math.isfinite(value) and low <= value <= high


def keeps_every_rule(job: JobSpec) -> None:
    segments = job.job_id.split("/")[1:]
    assert JOB_ID.fullmatch(job.job_id) and len(job.job_id) <= 512, job.job_id
    assert ".." not in job.job_id and "." not in segments

    res = job.resources
    assert isinstance(res.replicas, int) and within(res.replicas, 1, 4096)
    assert isinstance(res.device.count, int) and within(res.device.count, 0, 256)
    assert within(res.cpu, 0, 1024)
    assert isinstance(res.memory, int) and within(res.memory, 0, 32 * TiB)
    assert job.scheduling_deadline_ms is None or within(job.scheduling_deadline_ms, 0, 4_102_444_800_000)
    assert clean_name(res.device.variant) and len(res.device.variant) <= 256

    assert not any(name.startswith("IRIS_") for name in job.env)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in job.env)
    assert all(clean_text(value) for value in job.env.values())
    assert all(clean_text(argument) and "\x00" not in argument for argument in job.command)
    assert clean_name(job.image) and " " not in job.image

    for path in job.files:
        parts = path.split("/")
        assert clean_name(path) and not path.startswith("/") and "\\" not in path
        assert all(part not in ("", ".", "..") and len(part.encode()) <= 255 for part in parts)
        assert not any(f"{other}/" == path[: len(other) + 1] for other in job.files if other != path)

    for spec in job.constraints:
        assert clean_name(spec.key)
        for value in spec.values:
            assert clean_name(value) if isinstance(value, str) else within(value, -(2**53), 2**53)
    assert all(clean_name(region) for region in job.regions or ())
    assert all(clean_name(variant) and variant == variant.strip().lower() for variant in job.prefer)
    assert len(job.prefer) <= 16
    assert clean_name(job.target_cluster)

    # Whatever passes can be stored as strict JSON (PostgreSQL refuses NaN and lone surrogates),
    # and reads back as the same job.
    dumped = json.dumps(job.model_dump(mode="json"), allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert parse_job(json.loads(dumped)) == job
