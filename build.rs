//! Generates the kubelet gRPC APIs (clients and servers) from `proto/` with protox, so no
//! `protoc` is needed on the build machine. Output goes to OUT_DIR and is never committed.
//! Without the `kubelet-api` feature there is nothing to generate.

#[cfg(not(feature = "kubelet-api"))]
fn main() {}

#[cfg(feature = "kubelet-api")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/podresources/v1/api.proto",
        "proto/deviceplugin/v1beta1/api.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
