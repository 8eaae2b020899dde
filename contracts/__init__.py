"""What minipd's OpenAI-compatible responses must satisfy, checked by the `openai` package's own
models; shared by the tests and the benchmarks' load client, outside the `minipd` package because
it needs the optional `openai` package.

strict_openai     parse a response body or stream event strictly; a missing field is named by path
openai_contract   apply it to every generation response a test receives: raw HTTP bodies, event
                  streams as their bytes arrive, and an official client whose transport checks
"""
