//! ResourceSlices as the model holds them: k8s-openapi's `resource.k8s.io/v1` fields, with each
//! device's attribute and capacity maps stored flat. A dump of 5,000 nodes with 8 GPUs each
//! held 40,000 devices at about 4.5 KiB apiece as k8s-openapi values, most of it two B-tree
//! leaves of 11 slots for maps of one to four entries; flat, sorted and trimmed, a device takes
//! about a fifth of that. The same names and fields as k8s-openapi's, so code reads either alike.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::NodeSelector,
        resource::v1::{
            self as k8s, CounterSet, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint,
            NodeAllocatableResource, ResourcePool,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use numaplane::{
    device_numa::{DeviceNuma, DeviceNumaError, DriverNumaAttributes, numa_of},
    pci_locality::PciBusRange,
};
use serde::{Deserialize, Deserializer, Serialize};

/// A device's attributes or capacity: sorted by name, looked up by binary search.
pub type DeviceMap<V> = litemap::LiteMap<String, V>;

/// A `resource.k8s.io/v1` ResourceSlice. Its `apiVersion` and `kind` are the reader's to check.
/// A missing field decodes to its default, as k8s-openapi decodes it, so a slice read from a
/// dump and one converted from a watch event are the same.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ResourceSlice {
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The slice's pool, node and devices.
    #[serde(default)]
    pub spec: ResourceSliceSpec,
}

/// A ResourceSlice's spec (k8s-openapi's `ResourceSliceSpec`).
#[allow(missing_docs)]
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<Device>>,
    #[serde(default)]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_type_attribute: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_device_node_selection: Option<bool>,
    #[serde(default)]
    pub pool: ResourcePool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_counters: Option<Vec<CounterSet>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_node_operations: Option<Vec<String>>,
}

/// One device of a slice (k8s-openapi's `Device`, its two maps flat).
#[allow(missing_docs)]
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
    #[serde(
        default,
        deserialize_with = "trimmed",
        skip_serializing_if = "Option::is_none"
    )]
    pub attributes: Option<DeviceMap<DeviceAttribute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_conditions: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_failure_conditions: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binds_to_node: Option<bool>,
    #[serde(
        default,
        deserialize_with = "trimmed",
        skip_serializing_if = "Option::is_none"
    )]
    pub capacity: Option<DeviceMap<DeviceCapacity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumes_counters: Option<Vec<DeviceCounterConsumption>>,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_allocatable_resources: Option<BTreeMap<String, NodeAllocatableResource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<DeviceTaint>>,
}

/// A map decoded sorted (the last of repeated names wins, as in a B-tree) and without spare
/// room: a slice's devices are kept for as long as the slice.
fn trimmed<'de, D: Deserializer<'de>, V: Deserialize<'de>>(d: D) -> Result<Option<DeviceMap<V>>, D::Error> {
    Ok(Option::<DeviceMap<V>>::deserialize(d)?.map(trim))
}

fn trim<V>(map: DeviceMap<V>) -> DeviceMap<V> {
    let mut flat = map.into_tuple_vec();
    flat.shrink_to_fit();
    DeviceMap::from_sorted_store_unchecked(flat)
}

fn flat<V>(map: Option<BTreeMap<String, V>>) -> Option<DeviceMap<V>> {
    // A B-tree iterates in key order: the flat store is sorted as it is built.
    map.map(|m| trim(m.into_iter().collect()))
}

impl Device {
    /// Where this device of `driver` is placed ([`numaplane::device_numa::device_numa`]).
    pub fn numa(
        &self,
        driver: &str,
        driver_attributes: &DriverNumaAttributes,
        pci_locality: &[PciBusRange],
    ) -> Result<Option<DeviceNuma>, DeviceNumaError> {
        let attrs = self.attributes.as_ref();
        numa_of(
            driver,
            &self.name,
            |name| attrs?.get(name),
            driver_attributes,
            pci_locality,
        )
    }
}

impl From<k8s::Device> for Device {
    fn from(d: k8s::Device) -> Self {
        Device {
            all_nodes: d.all_nodes,
            allow_multiple_allocations: d.allow_multiple_allocations,
            attributes: flat(d.attributes),
            binding_conditions: d.binding_conditions,
            binding_failure_conditions: d.binding_failure_conditions,
            binds_to_node: d.binds_to_node,
            capacity: flat(d.capacity),
            consumes_counters: d.consumes_counters,
            name: d.name,
            node_allocatable_resources: d.node_allocatable_resources,
            node_name: d.node_name,
            node_selector: d.node_selector,
            taints: d.taints,
        }
    }
}

impl From<k8s::ResourceSlice> for ResourceSlice {
    fn from(s: k8s::ResourceSlice) -> Self {
        let spec = s.spec;
        ResourceSlice {
            metadata: s.metadata,
            spec: ResourceSliceSpec {
                all_nodes: spec.all_nodes,
                devices: spec.devices.map(|d| d.into_iter().map(Device::from).collect()),
                driver: spec.driver,
                node_name: spec.node_name,
                node_selector: spec.node_selector,
                partition_type_attribute: spec.partition_type_attribute,
                per_device_node_selection: spec.per_device_node_selection,
                pool: spec.pool,
                shared_counters: spec.shared_counters,
                skip_node_operations: spec.skip_node_operations,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::ResourceSlice;

    fn object() -> serde_json::Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n1-gpu", "resourceVersion": "7"},
            "spec": {"driver": "gpu.example.com", "nodeName": "n1",
                "pool": {"name": "n1", "generation": 2, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "mem", "counters": {"memory": {"value": "80Gi"}}}],
                "devices": [{"name": "gpu-0",
                    "attributes": {"z.example.com/model": {"string": "a100"},
                        "resource.kubernetes.io/numaNode": {"int": 1},
                        "driverVersion": {"version": "1.2.3"}, "ok": {"bool": true}},
                    "capacity": {"memory": {"value": "80Gi"}},
                    "consumesCounters": [{"counterSet": "mem", "counters": {"memory": {"value": "10Gi"}}}],
                    "taints": [{"key": "k", "effect": "NoSchedule"}],
                    "bindingConditions": ["ready"], "bindingFailureConditions": ["failed"],
                    "bindsToNode": true, "allowMultipleAllocations": true}]}})
    }

    #[test]
    fn a_slice_decoded_directly_equals_one_converted_from_k8s_openapi() {
        let direct: ResourceSlice = serde_json::from_value(object()).unwrap();
        let typed: k8s_openapi::api::resource::v1::ResourceSlice = serde_json::from_value(object()).unwrap();
        assert_eq!(direct, ResourceSlice::from(typed));
        let device = &direct.spec.devices.as_ref().unwrap()[0];
        let attributes = device.attributes.as_ref().unwrap();
        // Sorted by name whatever the input order, and looked up by name.
        let names: Vec<&str> = attributes.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "driverVersion",
                "ok",
                "resource.kubernetes.io/numaNode",
                "z.example.com/model"
            ]
        );
        assert_eq!(
            attributes.get("resource.kubernetes.io/numaNode").unwrap().int,
            Some(1)
        );
        assert_eq!(device.capacity.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn missing_fields_decode_to_the_defaults_k8s_openapi_gives_them() {
        for object in [
            json!({"kind": "ResourceSlice"}),
            json!({"spec": {"devices": [{"attributes": {"a": {"int": 1}}}]}}),
        ] {
            let direct: ResourceSlice = serde_json::from_value(object.clone()).unwrap();
            let mut typed = object;
            typed["apiVersion"] = json!("resource.k8s.io/v1");
            typed["kind"] = json!("ResourceSlice");
            let typed: k8s_openapi::api::resource::v1::ResourceSlice = serde_json::from_value(typed).unwrap();
            assert_eq!(direct, ResourceSlice::from(typed));
        }
    }

    #[test]
    fn a_repeated_attribute_keeps_its_last_value_as_a_b_tree_does() {
        let text = r#"{"spec": {"driver": "d", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "a", "attributes": {"x": {"int": 1}, "x": {"int": 2}}}]}}"#;
        let s: ResourceSlice = serde_json::from_str(text).unwrap();
        let attrs = s.spec.devices.unwrap()[0].attributes.clone().unwrap();
        assert_eq!((attrs.len(), attrs.get("x").unwrap().int), (1, Some(2)));
    }
}
