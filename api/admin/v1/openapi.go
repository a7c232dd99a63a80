package adminv1

import _ "embed"

// OpenAPI is the OpenAPI (Swagger 2.0) document of the admin API's REST
// mapping, as make proto generated it; the admin server serves it at
// /v1/openapi.json.
//
//go:embed admin.swagger.json
var OpenAPI []byte
