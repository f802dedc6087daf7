"""High availability: several ``oasisd`` on one PostgreSQL store, one of them leading.

- :mod:`.settings`: the ``[ha]`` section of the config.
- :mod:`.leadership`: the election (a PostgreSQL session advisory lock whose session
  PostgreSQL ends once it idles past the lease), the epoch bump, stepping down.

The fence every write transaction passes is
:meth:`controller.admission.state.AdmissionState._write`; the standby's incremental
apply is :mod:`controller.admission.follow`.
"""
