"""What imports nothing of the kit outside this package: errors, the clock, atomic
writes, secrets, JSON reading and the small vocabularies."""
