"""CustomResourceDefinitions the double can install: spire-controller-manager's
ClusterStaticEntry (config/crd/bases/spire.spiffe.io_clusterstaticentries.yaml: cluster
scoped, status subresource, `spiffeID`, `parentID` and `selectors` required)."""

from __future__ import annotations

from typing import Any

_STRINGS = {"type": "array", "items": {"type": "string"}}

CLUSTER_STATIC_ENTRY: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "clusterstaticentries.spire.spiffe.io",
        "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.3"},
    },
    "spec": {
        "group": "spire.spiffe.io",
        "names": {
            "kind": "ClusterStaticEntry",
            "listKind": "ClusterStaticEntryList",
            "plural": "clusterstaticentries",
            "singular": "clusterstaticentry",
        },
        "scope": "Cluster",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["parentID", "selectors", "spiffeID"],
                                "properties": {
                                    "admin": {"type": "boolean"},
                                    "className": {"type": "string"},
                                    "dnsNames": _STRINGS,
                                    "downstream": {"type": "boolean"},
                                    "federatesWith": _STRINGS,
                                    "hint": {"type": "string"},
                                    "jwtSVIDTTL": {"type": "string"},
                                    "parentID": {"type": "string"},
                                    "selectors": _STRINGS,
                                    "spiffeID": {"type": "string"},
                                    "storeSVID": {"type": "boolean"},
                                    "x509SVIDTTL": {"type": "string"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "required": ["masked", "rendered", "set"],
                                "properties": {
                                    "masked": {"type": "boolean"},
                                    "rendered": {"type": "boolean"},
                                    "set": {"type": "boolean"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}
