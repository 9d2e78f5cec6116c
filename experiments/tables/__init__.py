"""The paper's tables: Table 3, Table 4, the queue priorities, the arrival
rates and an ElasticFlow trace (Hops §4.2-4.6)."""
