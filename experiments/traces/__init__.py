"""The four ElasticFlow traces at a set offered load."""
