//! What `kubectl numa` reads from the API server, with each failure mapped to one clear
//! [`KubectlError`]: a missing CRD, access denied, an unreachable server.

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
    config::KubeConfigOptions,
};
use numaplane::nrt::{self, NodeResourceTopology};

use super::KubectlError;

/// The NRTs as listed: those that decode, and one line per object that does not (a malformed
/// object must not hide the others).
#[derive(Debug, Default)]
pub struct ListedNrts {
    /// Decoded objects.
    pub nrts: Vec<NodeResourceTopology>,
    /// `NodeResourceTopology NAME: why`, per object that does not decode.
    pub undecodable: Vec<String>,
}

/// Builds the client as kubectl would: `--kubeconfig` (or, without it, `$KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster configuration), `--context`; returns it with the
/// context's default namespace.
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timeout: Duration,
) -> Result<(Client, String), KubectlError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let load = |source| KubectlError::LoadKubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(load)?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(load)?
        }
        // A context names a kubeconfig entry, so in-cluster configuration cannot serve it.
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| KubectlError::InferConfig(Box::new(e)))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| KubectlError::InferConfig(Box::new(e)))?,
    };
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(KubectlError::BuildClient)?;
    Ok((client, namespace))
}

/// Maps a failed request: 403 to [`KubectlError::Forbidden`], anything else to
/// [`KubectlError::Request`].
fn request_error(what: String, source: kube::Error) -> KubectlError {
    match source {
        kube::Error::Api(status) if status.code == 403 => KubectlError::Forbidden {
            what,
            message: status.message.clone(),
        },
        source => KubectlError::Request { what, source },
    }
}

/// Lists every NRT. A 404 on the list means the CRD is not installed.
pub async fn list_nrts(client: &Client) -> Result<ListedNrts, KubectlError> {
    let resource = ApiResource::erase::<NodeResourceTopology>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(KubectlError::CrdMissing {
                api_version: nrt::API_VERSION,
            });
        }
        Err(e) => {
            return Err(request_error(format!("list {}.{}", nrt::PLURAL, nrt::GROUP), e));
        }
    };
    let mut out = ListedNrts::default();
    for item in list.items {
        let name = item
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| "<unnamed>".to_owned());
        // Decoded one by one so that one malformed object is reported, not fatal.
        let decoded = serde_json::to_value(&item).and_then(serde_json::from_value::<NodeResourceTopology>);
        match decoded {
            Ok(t) => out.nrts.push(t),
            Err(e) => out
                .undecodable
                .push(format!("NodeResourceTopology {name} is malformed: {e}")),
        }
    }
    out.nrts.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(out)
}

/// Reads one pod.
pub async fn get_pod(client: &Client, namespace: &str, name: &str) -> Result<Pod, KubectlError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(pod)) => Ok(pod),
        Ok(None) => Err(KubectlError::PodNotFound {
            pod: format!("{namespace}/{name}"),
        }),
        Err(e) => Err(request_error(format!("get pod {namespace}/{name}"), e)),
    }
}

/// Lists every Node.
pub async fn list_nodes(client: &Client) -> Result<Vec<Node>, KubectlError> {
    let api: Api<Node> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| request_error("list nodes".to_owned(), e))
}

/// Lists the bound, non-terminal pods of every namespace: what occupies the nodes, as the
/// scheduler's pod watch sees it.
pub async fn list_bound_pods(client: &Client) -> Result<Vec<Pod>, KubectlError> {
    let api: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let pods = api
        .list(&lp)
        .await
        .map_err(|e| request_error("list pods in all namespaces".to_owned(), e))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
        })
        .collect())
}

/// The PersistentVolumeClaims of `namespace`, every PersistentVolume,
/// StorageClass and CSINode: what the scheduler's volume rules read for a pod with claims.
pub async fn list_storage(
    client: &Client,
    namespace: &str,
) -> Result<crate::volume_binding::StorageObjects, KubectlError> {
    use k8s_openapi::api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::{CSINode, StorageClass},
    };
    let lp = ListParams::default();
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let classes: Api<StorageClass> = Api::all(client.clone());
    Ok(crate::volume_binding::StorageObjects {
        claims: claims
            .list(&lp)
            .await
            .map_err(|e| request_error(format!("list persistentvolumeclaims in {namespace}"), e))?
            .items,
        volumes: volumes
            .list(&lp)
            .await
            .map_err(|e| request_error("list persistentvolumes".to_owned(), e))?
            .items,
        classes: classes
            .list(&lp)
            .await
            .map_err(|e| request_error("list storageclasses.storage.k8s.io".to_owned(), e))?
            .items,
        csi_nodes: csi_nodes
            .list(&lp)
            .await
            .map_err(|e| request_error("list csinodes.storage.k8s.io".to_owned(), e))?
            .items,
    })
}

/// Lists every PodDisruptionBudget: which pods a preemption would rather keep.
pub async fn list_budgets(
    client: &Client,
) -> Result<Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>, KubectlError> {
    let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| request_error("list poddisruptionbudgets.policy".to_owned(), e))
}

/// The DRA objects a pod with resource claims is decided on: every DeviceClass and
/// ResourceSlice, and the ResourceClaims of the pod's namespace (`resource.k8s.io/v1`).
pub async fn list_dra(
    client: &Client,
    namespace: &str,
) -> Result<
    (
        Vec<k8s_openapi::api::resource::v1::DeviceClass>,
        Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
        Vec<k8s_openapi::api::resource::v1::ResourceClaim>,
    ),
    KubectlError,
> {
    use k8s_openapi::api::resource::v1::DeviceClass;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let classes = classes
        .list(&ListParams::default())
        .await
        .map_err(|e| request_error("list deviceclasses.resource.k8s.io".to_owned(), e))?;
    let (slices, claims) = list_slices_and_claims(client, namespace).await?;
    Ok((classes.items, slices, claims))
}

/// Where a bound pod's claims' devices are: every ResourceSlice, and the ResourceClaims of the
/// pod's namespace (`resource.k8s.io/v1`).
pub async fn list_slices_and_claims(
    client: &Client,
    namespace: &str,
) -> Result<
    (
        Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
        Vec<k8s_openapi::api::resource::v1::ResourceClaim>,
    ),
    KubectlError,
> {
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default();
    let slices = slices
        .list(&lp)
        .await
        .map_err(|e| request_error("list resourceslices.resource.k8s.io".to_owned(), e))?;
    let claims = claims
        .list(&lp)
        .await
        .map_err(|e| request_error(format!("list resourceclaims.resource.k8s.io in {namespace}"), e))?;
    Ok((slices.items, claims.items))
}

/// Lists every Namespace: their labels decide `namespaceSelector`s.
pub async fn list_namespaces(
    client: &Client,
) -> Result<Vec<k8s_openapi::api::core::v1::Namespace>, KubectlError> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| request_error("list namespaces".to_owned(), e))
}
