"""The one place an MQTT client is made: credentials, TLS and timeouts from the config."""

from __future__ import annotations

import aiomqtt

from controller.plane.settings import MqttConfig

__all__ = ["client_for"]


def client_for(
    mqtt: MqttConfig, identifier: str, will: aiomqtt.Will | None = None
) -> aiomqtt.Client:
    """An ``aiomqtt`` client for the configured broker (TLS and credentials included)."""
    tls = aiomqtt.TLSParameters(ca_certs=mqtt.tls_ca or None) if mqtt.tls else None
    client = aiomqtt.Client(
        mqtt.host,
        mqtt.port,
        username=mqtt.username or None,
        password=mqtt.password or None,
        identifier=identifier,
        will=will,
        tls_params=tls,
        keepalive=max(5, int(mqtt.heartbeat_timeout)),
        max_inflight_messages=200,
        timeout=10.0,
    )
    # a slot boundary publishes every server's plan at once: that is expected, not a leak
    client.pending_calls_threshold = 100_000
    return client
