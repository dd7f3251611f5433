"""What a user touches: the JobClient, job records, the CLI."""
