"""Load generation: prompt sets, one streaming client, the locust user, request records."""
