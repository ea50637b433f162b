"""A synthetic 1,000-tool catalog and a labelled set of queries (for bench/catalog.py and the catalog tests).

40 connectors (services) × 5 kinds of object × 5 actions. Each tool's description says what it does in
plain words; each query asks for one tool in other words (synonyms for the action, the object and often the
service), so keyword search alone misses some and meaning has to carry the rest.
"""

from __future__ import annotations

import random
from typing import Any

from ringlet.tools.base import StaticToolset, Tool, schema_validator

SERVICES: dict[str, tuple[str, str, list[str]]] = {
    # connector: (description, a synonym, its five objects)
    "billing": ("the billing system", "invoicing", ["invoice", "refund", "subscription", "coupon", "payment"]),
    "crm": ("the customer relationship manager", "sales database", ["lead", "contact", "deal", "account", "pipeline"]),
    "github": ("GitHub", "code hosting", ["repository", "pull_request", "issue", "branch", "release"]),
    "jira": ("Jira", "issue tracker", ["ticket", "sprint", "epic", "board", "worklog"]),
    "slack": ("Slack", "team chat", ["channel", "message", "reminder", "emoji", "huddle"]),
    "calendar": ("the calendar", "schedule", ["meeting", "event", "availability", "room_booking", "invitation"]),
    "storage": ("object storage", "file bucket", ["bucket", "file", "folder", "share_link", "snapshot"]),
    "dns": ("DNS", "domain name service", ["record", "zone", "domain", "certificate", "redirect"]),
    "kubernetes": ("Kubernetes", "container cluster", ["deployment", "pod", "namespace", "secret", "config_map"]),
    "postgres": ("the Postgres database", "SQL database", ["table", "index", "role", "backup", "replica"]),
    "email": ("email", "mail", ["draft", "mailbox", "filter", "attachment", "signature"]),
    "hr": ("the HR system", "people system", ["employee", "leave_request", "payslip", "onboarding", "review"]),
    "inventory": ("inventory", "stock system", ["product", "warehouse", "shipment", "supplier", "stock_level"]),
    "analytics": ("analytics", "metrics platform", ["dashboard", "report", "funnel", "cohort", "alert_rule"]),
    "support": ("the help desk", "customer support desk", ["case", "macro", "satisfaction_survey", "sla", "queue"]),
    "docs": ("the document editor", "wiki", ["page", "comment", "template", "space", "revision"]),
    "cms": ("the website CMS", "content management", ["article", "media_asset", "menu", "author", "tag"]),
    "ads": ("the ad platform", "advertising", ["campaign", "ad_group", "creative", "budget", "audience"]),
    "payments": ("the card processor", "payment gateway", ["charge", "payout", "dispute", "customer_card", "webhook"]),
    "shipping": ("the shipping carrier", "delivery service", ["label", "pickup", "tracking_number", "rate_quote",
                                                                "return_label"]),
    "monitoring": ("monitoring", "observability", ["incident", "monitor", "oncall_schedule", "status_page", "silence"]),
    "ci": ("continuous integration", "build server", ["pipeline_run", "job", "artifact", "runner", "cache_entry"]),
    "vault": ("the secrets vault", "password manager", ["credential", "policy", "token", "lease", "audit_device"]),
    "identity": ("identity provider", "single sign-on", ["user", "group", "app_assignment", "mfa_factor", "session"]),
    "survey": ("the survey tool", "questionnaire", ["form", "question", "response", "respondent", "quota"]),
    "forum": ("the community forum", "discussion board", ["thread", "reply", "moderator", "badge", "category"]),
    "video": ("video conferencing", "video calls", ["recording", "webinar", "breakout_room", "transcript", "poll"]),
    "maps": ("the maps service", "geolocation", ["route", "geofence", "place", "address", "travel_time"]),
    "weather": ("the weather service", "forecast", ["forecast_report", "station", "severe_warning", "radar_image",
                                                     "climate_record"]),
    "translate": ("translation", "language service", ["glossary", "translation_job", "language_pair", "term",
                                                       "memory_entry"]),
    "accounting": ("the general ledger", "bookkeeping", ["journal_entry", "ledger_account", "tax_rate", "fiscal_period",
                                                          "expense"]),
    "legal": ("contract management", "legal", ["contract", "clause", "signature_request", "nda", "obligation"]),
    "travel": ("corporate travel", "trip booking", ["flight", "hotel", "itinerary", "visa", "travel_policy"]),
    "fleet": ("fleet management", "vehicle fleet", ["vehicle", "driver", "fuel_card", "maintenance", "trip_log"]),
    "iot": ("the device hub", "connected devices", ["device", "sensor", "firmware", "telemetry_stream", "command"]),
    "search": ("site search", "search engine", ["search_index", "synonym", "ranking_rule", "query_log", "facet"]),
    "learning": ("the learning platform", "training portal", ["course", "lesson", "quiz", "certificate_award",
                                                               "enrollment"]),
    "events": ("event ticketing", "conference tickets", ["ticket_type", "attendee", "venue", "session_slot",
                                                          "sponsor"]),
    "realestate": ("facilities", "office buildings", ["desk", "floor_plan", "visitor", "access_badge", "parking_spot"]),
    "procurement": ("procurement", "purchasing", ["purchase_order", "vendor", "requisition", "catalog_item",
                                                   "approval_chain"]),
}
ACTIONS = {
    "create": ("Create a new {o}", ["make a", "add a", "set up a", "open a new"]),
    "delete": ("Delete a {o}", ["remove the", "get rid of the", "erase the", "drop the"]),
    "list": ("List every {o}", ["show all", "enumerate the", "give me all", "what are the"]),
    "get": ("Get one {o} by id", ["look up the", "fetch the", "retrieve the", "find the details of the"]),
    "update": ("Update a {o}", ["change the", "modify the", "edit the", "adjust the"]),
}


def catalog_tools() -> dict[str, list[Tool]]:
    """connector → its 25 tools."""

    async def unused(args: dict[str, Any], ctx: Any) -> str:
        return "ok"

    out: dict[str, list[Tool]] = {}
    for service, (description, _, objects) in SERVICES.items():
        tools = []
        for obj in objects:
            words = obj.replace("_", " ")
            for action, (template, _) in ACTIONS.items():
                schema = {"type": "object", "properties": {f"{obj}_id": {"type": "string"}}}
                tools.append(Tool(name=f"{action}_{obj}"[:64], run=unused, effect="read" if action in ("list", "get")
                                  else "write", description=f"{template.format(o=words)} in {description}.",
                                  parameters=schema, validate=schema_validator(schema)))
        out[service] = tools
    return out


def connectors() -> dict[str, StaticToolset]:
    return {name: StaticToolset(tools) for name, tools in catalog_tools().items()}


def labelled_queries(n: int = 120, seed: int = 11) -> list[tuple[str, tuple[str, str]]]:
    """(query, (connector, tool)): the action always in other words; the service by its synonym half the
    time; the object as written."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        service = rng.choice(list(SERVICES))
        description, synonym, objects = SERVICES[service]
        obj = rng.choice(objects)
        action = rng.choice(list(ACTIONS))
        phrase = rng.choice(ACTIONS[action][1])
        where = synonym if rng.random() < 0.5 else description.removeprefix("the ")
        out.append((f"{phrase} {obj.replace('_', ' ')} in {where}", (service, f"{action}_{obj}"[:64])))
    return out
