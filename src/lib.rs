//! numaplane shared vocabulary: the NodeResourceTopology types and CRD, exact Kubernetes
//! quantities and the pod-set fingerprint. Behind features: the kubelet gRPC APIs
//! (`kubelet-api`) and the metrics and probe server both binaries serve (`serve`).

pub mod allocation;
pub mod crd;
pub mod device_numa;
pub mod exposition;
pub mod fingerprint;
pub mod metrics;
pub mod nrt;
pub mod pci_locality;
pub mod quantity;
pub mod resource_name;
#[cfg(feature = "serve")]
pub mod serve;

/// Renders an error and its whole source chain on one line, `outer: inner: root`, for the
/// single clear line that command-line failures print.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

/// Parses a boolean as Go's `strconv.ParseBool` does (how the kubelet reads its policy
/// options): `1 t T TRUE true True` and `0 f F FALSE false False`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Exit code for bad configuration or bad command-line input (`EX_USAGE`).
pub const EXIT_CONFIG: u8 = 64;

/// Parses the command line of binary `bin`. Help and version print and exit 0; any usage error
/// is one line on stderr and exit code 64 (clap's own multi-line output and exit code 2 would
/// break the one-clear-line rule for bad configuration).
pub fn parse_args<T: clap::Parser>(bin: &str) -> Result<T, std::process::ExitCode> {
    match T::try_parse() {
        Ok(args) => Ok(args),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                Err(if e.use_stderr() {
                    std::process::ExitCode::from(EXIT_CONFIG)
                } else {
                    std::process::ExitCode::SUCCESS
                })
            }
            _ => {
                let rendered = e.render().to_string();
                let line = rendered
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("invalid arguments")
                    .trim_start_matches("error: ");
                eprintln!("{bin}: {line} (see --help)");
                Err(std::process::ExitCode::from(EXIT_CONFIG))
            }
        },
    }
}

/// Generated kubelet gRPC APIs.
#[cfg(feature = "kubelet-api")]
pub mod proto {
    /// Pod-resources API v1.
    pub mod podresources {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("v1");
    }
    /// Device plugin API v1beta1.
    pub mod deviceplugin {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("v1beta1");
    }
}

#[cfg(all(test, feature = "kubelet-api"))]
mod proto_wire_tests {
    //! Hand-built bytes at the documented field numbers prove wire compatibility with the kubelet.
    use prost::Message;

    use crate::proto::{deviceplugin as dp, podresources as pr};

    fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, bytes: &[u8]) {
        assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
        assert_eq!(&M::decode(bytes).expect("decode"), msg);
    }

    #[test]
    fn numa_node_id_is_field_1_varint() {
        round_trip(&pr::NumaNode { id: 3 }, &[0x08, 0x03]);
        // -1 ("no affinity") is a ten-byte two's-complement varint for int64.
        round_trip(
            &pr::NumaNode { id: -1 },
            &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        );
    }

    #[test]
    fn container_devices_topology_is_field_3() {
        let msg = pr::ContainerDevices {
            resource_name: "r".into(),
            device_ids: vec!["d".into()],
            topology: Some(pr::TopologyInfo {
                nodes: vec![pr::NumaNode { id: 3 }],
            }),
        };
        let bytes = [
            0x0a, 0x01, b'r', // resource_name = 1
            0x12, 0x01, b'd', // device_ids = 2
            0x1a, 0x04, 0x0a, 0x02, 0x08, 0x03, // topology = 3 { nodes = 1 { ID = 1 } }
        ];
        round_trip(&msg, &bytes);
    }

    #[test]
    fn pod_level_cpu_ids_and_memory_are_fields_4_and_5() {
        let msg = pr::PodResources {
            name: "p".into(),
            namespace: String::new(),
            containers: vec![],
            cpu_ids: vec![1, 2],
            memory: vec![pr::ContainerMemory {
                memory_type: "memory".into(),
                size: 5,
                topology: None,
            }],
        };
        let bytes = [
            0x0a, 0x01, b'p', // name = 1
            0x22, 0x02, 0x01, 0x02, // cpu_ids = 4, packed
            0x2a, 0x0a, 0x0a, 0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x10, 0x05, // memory = 5
        ];
        round_trip(&msg, &bytes);
    }

    #[test]
    fn container_dynamic_resources_is_field_5_and_share_id_optional() {
        let msg = pr::ContainerResources {
            name: String::new(),
            devices: vec![],
            cpu_ids: vec![],
            memory: vec![],
            dynamic_resources: vec![pr::DynamicResource {
                claim_name: "c".into(),
                claim_namespace: String::new(),
                claim_resources: vec![pr::ClaimResource {
                    share_id: Some(String::new()),
                    ..Default::default()
                }],
            }],
        };
        // dynamic_resources = 5 { claim_name = 2, claim_resources = 4 { share_id = 5 (explicit empty) } }
        let bytes = [0x2a, 0x07, 0x12, 0x01, b'c', 0x22, 0x02, 0x2a, 0x00];
        round_trip(&msg, &bytes);
    }

    #[test]
    fn device_plugin_fields() {
        let msg = dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into()],
            must_include_device_i_ds: vec!["b".into()],
            allocation_size: 2,
        };
        round_trip(&msg, &[0x0a, 0x01, b'a', 0x12, 0x01, b'b', 0x18, 0x02]);
        let dev = dp::Device {
            id: "g0".into(),
            health: "Healthy".into(),
            topology: Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 1 }],
            }),
        };
        let mut bytes = vec![0x0a, 0x02, b'g', b'0', 0x12, 0x07];
        bytes.extend_from_slice(b"Healthy");
        bytes.extend_from_slice(&[0x1a, 0x04, 0x0a, 0x02, 0x08, 0x01]);
        round_trip(&dev, &bytes);
        let opts = dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        };
        round_trip(&opts, &[0x10, 0x01]);
    }

    #[test]
    fn watch_response_shape() {
        let msg = pr::WatchPodResourcesResponse {
            action: pr::WatchPodAction::Deleted as i32,
            uid: "u".into(),
            pod_resources: vec![],
        };
        round_trip(&msg, &[0x08, 0x01, 0x12, 0x01, b'u']);
    }
}
