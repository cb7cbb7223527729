"""Load scenario for the tutorial service: the mix of the original k6 script, for locust.

Each simulated user loops over: health; create a user, list users, fetch that user; a lookup
miss; a Fibonacci compute with n in 10/15/20; an invalid e-mail; n = 100. Every request checks
the status code the service contract gives it, so a wrong answer counts as a failure.
Users ramp from 5 to 20 over the first three quarters of the run, then hold.

    make load                                         # 20 s against http://localhost:8080
    make load SERVICE_URL=http://host:8080 LOAD_SECONDS=120
"""

import os
import random
import uuid

from locust import HttpUser, LoadTestShape, between, task

START_USERS = 5
PEAK_USERS = 20
RUN_SECONDS = int(os.environ.get("LOAD_SECONDS", "20"))


def expect(response, status, check=None):
    """Marks `response` failed unless it has `status` and, when given, passes `check(json)`."""
    if response.status_code != status:
        response.failure(f"expected {status}, got {response.status_code}: {response.text[:100]}")
        return None
    try:
        body = response.json() if response.content else None
    except ValueError:
        response.failure(f"not JSON: {response.text[:100]}")
        return None
    try:
        as_expected = check is None or check(body)
    except (KeyError, TypeError):
        as_expected = False
    if not as_expected:
        response.failure(f"unexpected body: {response.text[:100]}")
        return None
    response.success()
    return body


class ServiceUser(HttpUser):
    """One client walking through every endpoint of the API."""

    wait_time = between(0.1, 0.5)

    @task
    def scenario(self):
        with self.client.get("/api/health", catch_response=True) as r:
            expect(r, 200, lambda body: body["status"] == "healthy")

        email = f"load-{uuid.uuid4()}@example.com"
        with self.client.post(
            "/api/users", json={"name": "Load Tester", "email": email}, catch_response=True
        ) as r:
            created = expect(r, 201, lambda body: body["email"] == email and "id" in body)

        with self.client.get("/api/users", catch_response=True) as r:
            expect(r, 200, lambda body: isinstance(body, list))

        if created is not None:
            with self.client.get(
                f"/api/users/{created['id']}", name="/api/users/{id}", catch_response=True
            ) as r:
                expect(r, 200, lambda body: body["id"] == created["id"])

        with self.client.get(
            f"/api/users/{uuid.uuid4()}", name="/api/users/{id} (miss)", catch_response=True
        ) as r:
            expect(r, 404, lambda body: body == {"error": "User not found"})

        n = random.choice([10, 15, 20])
        with self.client.post(
            "/api/compute", json={"n": n}, name="/api/compute", catch_response=True
        ) as r:
            expect(r, 200, lambda body: body["input"] == n and body["result"] > 0)

        with self.client.post(
            "/api/users",
            json={"name": "Invalid", "email": "not-an-email"},
            name="/api/users (invalid email)",
            catch_response=True,
        ) as r:
            expect(r, 400, lambda body: body == {"error": "Invalid email format"})

        with self.client.post(
            "/api/compute", json={"n": 100}, name="/api/compute (n=100)", catch_response=True
        ) as r:
            expect(r, 400, lambda body: "error" in body)


class RampFiveToTwenty(LoadTestShape):
    """5 users at once, 20 by three quarters of the run, held until the end."""

    def tick(self):
        elapsed = self.get_run_time()
        if elapsed >= RUN_SECONDS:
            return None
        ramp = min(1.0, elapsed / (RUN_SECONDS * 0.75))
        return round(START_USERS + (PEAK_USERS - START_USERS) * ramp), 5
