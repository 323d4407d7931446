//! The fmsched.v1 gRPC API: generated messages, clients and servers, the file
//! descriptor set for server reflection, and conversions between protobuf
//! messages and the domain types of `fmsched-core`.
//!
//! Conversions live here, once, so the scheduler (server side) and fmctl
//! (client side) cannot disagree about what a field means.

pub mod codec;
pub mod convert;

/// Generated code for package `fmsched.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("fmsched.v1");
}

/// Encoded `FileDescriptorSet` of every fmsched.v1 file, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fmsched_v1_descriptor");

/// gRPC server reflection, `v1` and `v1alpha`, over every fmsched.v1
/// service and gRPC health: what each fmsched server exposes.
#[allow(clippy::type_complexity)]
pub fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// Largest request a server accepts (bigger requests are refused before decoding).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
