//! One node's kubelet side for an exporter that hosts the device-plugin allocator: a temporary
//! directory with the pod-resources socket, the device-plugin directory and the `--pools` file,
//! the fake kubelet's two servers started on them, and the exporter spawned on them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use numaplane::proto::podresources::{
    AllocatableResourcesResponse, ContainerDevices, NumaNode, TopologyInfo,
};
use serde_json::{Value, json};

use super::{Agent, allocator_exporter_args, device_plugin_args};
use crate::control_plane::HarnessError;
use crate::fake_device_kubelet::FakeDeviceKubelet;
use crate::fake_kubelet::{FakeKubelet, FakeKubeletOptions};

/// The files of one node's kubelet, in a directory of their own (removed on drop).
pub struct NodeFiles {
    /// Holds the sockets and files.
    pub dir: tempfile::TempDir,
    /// The pod-resources socket.
    pub socket: PathBuf,
    /// The device-plugin directory (`kubelet.sock` and the plugins' sockets).
    pub plugins: PathBuf,
    /// The exporter's `--pools` file.
    pub pools: PathBuf,
}

impl NodeFiles {
    /// A new directory with an empty device-plugin directory and `pools` written as the pools file.
    pub fn new(pools: &serde_json::Value) -> Result<NodeFiles, HarnessError> {
        let dir = tempfile::tempdir()?;
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir(&plugins)?;
        let socket = dir.path().join("podres.sock");
        let pools_file = dir.path().join("pools.yaml");
        std::fs::write(&pools_file, pools.to_string())?;
        Ok(NodeFiles {
            dir,
            socket,
            plugins,
            pools: pools_file,
        })
    }

    /// Starts the kubelet's device-plugin registry (`kubelet.sock`).
    pub async fn device_kubelet(&self) -> Result<FakeDeviceKubelet, HarnessError> {
        Ok(FakeDeviceKubelet::start(&self.plugins).await?)
    }

    /// Starts the kubelet's pod-resources server: `allocatable`, no pods yet.
    pub async fn podres(
        &self,
        allocatable: AllocatableResourcesResponse,
    ) -> Result<FakeKubelet, HarnessError> {
        Ok(FakeKubelet::start(&self.socket, allocatable, vec![], FakeKubeletOptions::default()).await?)
    }

    /// The exporter's flags for `node`: [`allocator_exporter_args`] on these files, then `extra`.
    pub fn exporter_args(&self, node: &str, kubeconfig: &Path, extra: &[&str]) -> Vec<String> {
        allocator_exporter_args(node, &self.socket, kubeconfig, &self.pools, &self.plugins, extra)
    }

    /// The flags of `numaplane-exporter device-plugin` for `node` on these files, with the
    /// machine `topology_xml`, then `extra`.
    pub fn device_plugin_args(
        &self,
        node: &str,
        kubeconfig: &Path,
        topology_xml: &Path,
        extra: &[&str],
    ) -> Vec<String> {
        let mut args = device_plugin_args(
            node,
            &self.socket,
            kubeconfig,
            &self.pools,
            &self.plugins,
            topology_xml,
        );
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// Spawns `numaplane-exporter run` with [`Self::exporter_args`] and waits until it serves.
    pub async fn exporter(
        &self,
        node: &str,
        kubeconfig: &Path,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<Agent, HarnessError> {
        let mut exporter = Agent::spawn_exporter("run", &self.exporter_args(node, kubeconfig, extra))?;
        exporter.wait_serving(timeout).await?;
        Ok(exporter)
    }
}

/// A pool of the `--pools` file: `resource` with the devices `ids`, each on NUMA node `numa(id)`.
pub fn pool(resource: &str, ids: &[String], numa: impl Fn(&str) -> i64) -> Value {
    let devices: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "numaNode": numa(id)}))
        .collect();
    json!({"resource": resource, "devices": devices})
}

/// The devices `ids` of `resource` as pod-resources reports them allocatable, each on NUMA node
/// `numa(id)`.
pub fn podres_devices(resource: &str, ids: &[String], numa: impl Fn(&str) -> i64) -> Vec<ContainerDevices> {
    ids.iter()
        .map(|id| ContainerDevices {
            resource_name: resource.into(),
            device_ids: vec![id.clone()],
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: numa(id) }],
            }),
        })
        .collect()
}
