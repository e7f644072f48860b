# Canopy as a container: `docker compose up` (see docker-compose.yml) runs it against
# an S3-compatible store.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin canopy

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/canopy /usr/local/bin/canopy
EXPOSE 4222 1883 8080
ENTRYPOINT ["canopy"]
# Inside the container canopy must listen beyond loopback; without authentication
# that needs --allow-anonymous, so docker-compose.yml publishes the port on the host's
# loopback only.
CMD ["serve", "--listen", "0.0.0.0:4222", "--mqtt-listen", "0.0.0.0:1883", \
     "--http-listen", "0.0.0.0:8080", "--allow-anonymous"]
