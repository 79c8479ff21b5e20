"""Record a host for replay (:mod:`.record`: everything the services and the metrics read, in one read-only round
trip) and take the secrets out of a recording (:mod:`.redact`). Above services and observe, whose lists it reads;
below the CLI."""
