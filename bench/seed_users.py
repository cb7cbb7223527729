"""Stores users through the API and prints their ids, one per line: the bench's lookup targets.

Usage: seed_users.py BASE_URL COUNT
"""
import json
import sys
import urllib.request

base_url, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    body = json.dumps({"name": f"Seed {i}", "email": f"seed{i}@example.com"}).encode()
    request = urllib.request.Request(f"{base_url}/api/users", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        print(json.load(response)["id"])
