//! The codec of every fmsched gRPC service: prost's, except that a message
//! that does not decode (garbage bytes, a string field that is not UTF-8)
//! is the caller's error, INVALID_ARGUMENT, not the INTERNAL that tonic's
//! prost codec answers: nothing went wrong inside the receiver, and a
//! client that retries INTERNAL would send the same bytes again.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// [`tonic_prost::ProstCodec`] with decode errors as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct FieldCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for FieldCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for FieldCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = FieldDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        FieldDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// Prost's decoder; its errors as INVALID_ARGUMENT (see the module docs).
#[derive(Debug)]
pub struct FieldDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for FieldDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "the message does not decode (not protobuf of this method's type, or a string \
                 that is not UTF-8): {}",
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
