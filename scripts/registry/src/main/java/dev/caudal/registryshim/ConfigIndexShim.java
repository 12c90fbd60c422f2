package dev.caudal.registryshim;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;

import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;
import java.util.ArrayList;

/**
 * Stands in for the one build-time bean of apicurio-common-app-components-config-index-deployment
 * (not served by Maven Central at 0.1.18.Final): the list of dynamic (UI-editable) settings, empty.
 */
@ApplicationScoped
public class ConfigIndexShim {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new ArrayList<>());
    }
}
