"""outbox_lite's peewee-migrate migrations (installed as ``outbox_lite.migrations``)."""
