"""The execution plane: plans to node agents over MQTT, progress and heartbeats back,
and the daemon's reactions (early completion, failed servers, slow jobs).

Importing this package loads no MQTT code; :mod:`controller.plane.link` does.
"""
