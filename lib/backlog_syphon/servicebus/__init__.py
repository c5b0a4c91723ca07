"""Every use of the azure-servicebus SDK: no other package of the syphon imports it."""
