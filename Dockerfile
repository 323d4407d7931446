# One image with every fmsched binary; docker-compose.yml picks the command.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/ensure-build-tools.sh && cargo build --release --locked --bins \
 && mkdir /out && cp target/release/scheduler-svc target/release/estimator-svc \
    target/release/node-agent target/release/fmctl target/release/fake-trainer target/release/fmsim /out/

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* && useradd --system --home /var/lib/fmsched fmsched
COPY --from=build /out/ /usr/local/bin/
COPY examples /usr/share/fmsched/examples
USER fmsched
