//! The NodeResourceTopology CRD, generated from code so `deploy/crd.yaml` cannot drift.
//!
//! The schema mirrors the upstream CRD (`manifests/crd.yaml` of noderesourcetopology-api) field
//! for field, with the same required fields, and adds printer columns for `kubectl get`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// Failure to build or render the CRD.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The embedded definition did not deserialize into a CustomResourceDefinition.
    #[error("building the NodeResourceTopology CRD from its embedded definition")]
    Build(#[source] serde_json::Error),
    /// YAML rendering failed.
    #[error("rendering the NodeResourceTopology CRD as YAML")]
    Render(#[source] serde_saphyr::ser::Error),
}

const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn quantity() -> Value {
    json!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": true
    })
}

fn attribute_list() -> Value {
    json!({
        "description": "AttributeList contains an array of AttributeInfo objects.",
        "type": "array",
        "items": {
            "description": "AttributeInfo contains one attribute of a Zone.",
            "type": "object",
            "required": ["name", "value"],
            "properties": {"name": {"type": "string"}, "value": {"type": "string"}}
        }
    })
}

fn zone_list(with_attributes: bool) -> Value {
    let mut zone_props = json!({
        "costs": {
            "description": "CostList contains an array of CostInfo objects.",
            "type": "array",
            "items": {
                "description": "CostInfo describes the cost (or distance) between two Zones.",
                "type": "object",
                "required": ["name", "value"],
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": "integer", "format": "int64"}
                }
            }
        },
        "name": {"type": "string"},
        "parent": {"type": "string"},
        "resources": {
            "description": "ResourceInfoList contains an array of ResourceInfo objects.",
            "type": "array",
            "items": {
                "description": "ResourceInfo contains information about one resource type.",
                "type": "object",
                "required": ["allocatable", "available", "capacity", "name"],
                "properties": {
                    "allocatable": quantity(),
                    "available": quantity(),
                    "capacity": quantity(),
                    "name": {"type": "string"}
                }
            }
        },
        "type": {"type": "string"}
    });
    if with_attributes {
        zone_props["attributes"] = attribute_list();
    }
    json!({
        "description": "ZoneList contains an array of Zone objects.",
        "type": "array",
        "items": {
            "description": "Zone represents a resource topology zone, e.g. socket, node, die or core.",
            "type": "object",
            "required": ["name", "type"],
            "properties": zone_props
        }
    })
}

fn definition() -> Value {
    let v1alpha2 = json!({
        "description": "NodeResourceTopology describes node resources and their topology.",
        "type": "object",
        "required": ["zones"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "attributes": attribute_list(),
            "topologyPolicies": {
                "description": "DEPRECATED (to be removed in v1beta1): use top level attributes if needed",
                "type": "array",
                "items": {"type": "string"}
            },
            "zones": zone_list(true)
        }
    });
    let v1alpha1 = json!({
        "description": "NodeResourceTopology describes node resources and their topology.",
        "type": "object",
        "required": ["topologyPolicies", "zones"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "topologyPolicies": {"type": "array", "items": {"type": "string"}},
            "zones": zone_list(true)
        }
    });
    let columns = json!([
        {"name": "Policy", "type": "string", "jsonPath": ".topologyPolicies[0]",
         "description": "Deprecated combined Topology Manager policy; attributes carry the exact values"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]);
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "noderesourcetopologies.topology.node.k8s.io",
            "annotations": {
                "api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1870"
            }
        },
        "spec": {
            "group": "topology.node.k8s.io",
            "names": {
                "kind": "NodeResourceTopology",
                "listKind": "NodeResourceTopologyList",
                "plural": "noderesourcetopologies",
                "singular": "noderesourcetopology",
                "shortNames": ["node-res-topo"]
            },
            "scope": "Cluster",
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": v1alpha1}},
                {"name": "v1alpha2", "served": true, "storage": true,
                 "additionalPrinterColumns": columns,
                 "schema": {"openAPIV3Schema": v1alpha2}}
            ]
        }
    })
}

/// The CRD object.
pub fn crd() -> Result<CustomResourceDefinition, CrdError> {
    serde_json::from_value(definition()).map_err(CrdError::Build)
}

/// The CRD as a YAML document, as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, CrdError> {
    let crd = crd()?;
    let body = serde_saphyr::to_string(&crd).map_err(CrdError::Render)?;
    Ok(format!(
        "# Generated by `cargo run -p numaplane --bin numaplane-crdgen > deploy/crd.yaml`; do not edit.\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1alpha2_schema() -> Value {
        let crd = serde_json::to_value(crd().expect("crd")).expect("json");
        crd["spec"]["versions"][1]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn required_fields_match_upstream() {
        let s = v1alpha2_schema();
        assert_eq!(s["required"], json!(["zones"]));
        let zone = &s["properties"]["zones"]["items"];
        assert_eq!(zone["required"], json!(["name", "type"]));
        assert_eq!(
            zone["properties"]["resources"]["items"]["required"],
            json!(["allocatable", "available", "capacity", "name"])
        );
        assert_eq!(
            zone["properties"]["costs"]["items"]["required"],
            json!(["name", "value"])
        );
        assert_eq!(
            s["properties"]["attributes"]["items"]["required"],
            json!(["name", "value"])
        );
    }

    #[test]
    fn storage_version_is_v1alpha2_and_cluster_scoped() {
        let crd = crd().expect("crd");
        assert_eq!(crd.spec.scope, "Cluster");
        let storage: Vec<_> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.storage)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(storage, ["v1alpha2"]);
        assert!(crd.spec.versions.iter().all(|v| v.served));
    }

    #[test]
    fn committed_crd_is_up_to_date() {
        let committed = include_str!("../deploy/crd.yaml");
        assert_eq!(
            committed,
            crd_yaml().expect("yaml"),
            "deploy/crd.yaml is stale: run `cargo run -p numaplane --bin numaplane-crdgen > deploy/crd.yaml`"
        );
    }
}
