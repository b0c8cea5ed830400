"""The API double's selector parser and patch formats, on plain dicts."""

from __future__ import annotations

import pytest

from dynrunner.doubles.kubernetes import resources
from dynrunner.doubles.kubernetes.patch import json_patch, merge_patch, strategic_merge_patch
from dynrunner.doubles.kubernetes.selectors import fields_match, labels_match, parse_fields, parse_labels
from dynrunner.doubles.kubernetes.status import ApiError


def obj(**labels: str) -> dict:
    return {"metadata": {"name": "p", "labels": labels}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def test_label_selector_operators():
    assert labels_match(parse_labels("a in (1, 2),b notin (x),!c,d"), obj(a="2", b="y", d=""))
    assert not labels_match(parse_labels("a in (1,2)"), obj(a="3"))
    assert labels_match(parse_labels("a!=1"), obj()), "!= matches an absent key"
    assert labels_match(parse_labels("n>3,n<10"), obj(n="5"))


@pytest.mark.parametrize("bad", ["a in ()", "a=b c", "-a=b", "a=" + "x" * 64])
def test_bad_label_selectors_are_400(bad):
    with pytest.raises(ApiError) as exc:
        parse_labels(bad)
    assert exc.value.code == 400


def test_field_selectors_with_escapes_and_per_resource_fields():
    sel = parse_fields(r"spec.nodeName=n1,status.phase!=Failed,metadata.name=p", resources.PODS)
    assert fields_match(sel, obj())
    assert parse_fields(r"metadata.name=a\,b", resources.PODS) == (("metadata.name", "=", "a,b"),)
    with pytest.raises(ApiError):
        parse_fields("spec.nodeName=n1", resources.SECRETS)


def test_merge_patch_deletes_with_null_and_replaces_lists():
    assert merge_patch({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": None, "c": [3]}}) == {"a": {"c": [3]}}


def test_strategic_merge_patch_merges_lists_by_key_and_honours_directives():
    pod = {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
        "metadata": {"finalizers": ["x"]},
    }
    patch = {
        "spec": {
            "containers": [{"name": "b", "image": "2"}, {"name": "a", "$patch": "delete"}, {"name": "c", "image": "3"}]
        },
        "metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["x"]},
    }
    out = strategic_merge_patch(pod, patch)
    assert out["spec"]["containers"] == [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}]
    assert out["metadata"]["finalizers"] == ["y"]
    assert strategic_merge_patch({"m": {"a": 1}}, {"m": {"$patch": "replace", "b": 2}}) == {"m": {"b": 2}}


def test_json_patch_operations_and_failed_test():
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "move", "from": "/b/c", "path": "/d"}])
    assert out == {"a": [1, 2, 3], "b": {}, "d": 1}
    with pytest.raises(ApiError) as exc:
        json_patch(doc, [{"op": "test", "path": "/b/c", "value": 2}])
    assert exc.value.code == 422
