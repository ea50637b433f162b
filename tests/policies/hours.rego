package ringlet.hours

import rego.v1

# No writes to production outside 08:00-18:00 (policy time zone).
deny contains {"msg": "production writes only between 08:00 and 18:00", "policy_id": "change-window"} if {
	input.context.realm == "prod"
	input.resource.effect != "read"
	not within_hours
}

within_hours if {
	input.env.time_of_day >= "08:00"
	input.env.time_of_day < "18:00"
}
