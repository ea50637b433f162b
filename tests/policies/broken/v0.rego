package ringlet.old

deny[msg] {
	msg := "written for Rego v0"
}
